// Package replica runs `stickylb xds` as one replica of a replicated control plane: the
// pools file and the health verdicts live in etcd (xds/store), every replica serves what
// it reads there, under the store revision as the version, and one replica at a time,
// elected through etcd, probes the backends and writes the verdicts.
package replica

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds"
	"github.com/stickylb/stickylb/xds/store"
)

// Defaults of the replica's timing flags.
const (
	DefaultLeaseTTL     = 5 * time.Second
	DefaultStoreTimeout = 10 * time.Second
	// firstVerdictSlack is added to the health checks' first-verdict bound before a
	// replica starting cold serves without a stored verdict for every backend (as the
	// one-process control plane's hold).
	firstVerdictSlack = 250 * time.Millisecond
	// retryEvery paces the attempts to reach a store that does not answer.
	retryEvery = 500 * time.Millisecond
)

// Config is one replica's settings.
type Config struct {
	// ID names the replica in the election, the verdicts it writes and its status page.
	ID string
	// Keys are the store's keys (its prefix).
	Keys store.Keys
	// LeaseTTL is the election session's lease (whole seconds): a leader that stops
	// answering is replaced within it. Default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// StoreTimeout: with no successful exchange with etcd for this long, the replica stops
	// serving (it ends its streams and refuses new ones). Default DefaultStoreTimeout.
	StoreTimeout time.Duration
	// HealthOptions are passed to the leader's health checkers (tests shorten intervals).
	HealthOptions []health.Option
}

// Replica is one replica: its xDS server, the gate in front of it, and the loops that
// follow the store and, while it leads, probe.
type Replica struct {
	cfg  Config
	cli  *clientv3.Client
	log  *zap.Logger
	srv  *xds.Server
	gate *Gate

	// served is the state the server's current version was built from (what its health
	// view reads); swapped only under the server's build lock (UpdateAt's prepare).
	served atomic.Pointer[store.State]
	// connected: the replica has read the whole state since it last lost the store.
	connected atomic.Bool
	lastOK    atomic.Int64 // unix nanoseconds of the last successful exchange with etcd
	leading   atomic.Bool
	members   atomic.Pointer[[]store.Member]
	started   time.Time

	mu sync.Mutex // guards the fields below and orders installs
	// file is the pools file in service and the document revision it was parsed from.
	file    *pools.File
	fileRev int64
	// published is the file of the server's current version.
	published *pools.File
	latest    *store.State // the newest state read, served or not
	// untranslatable is the last file the server refused to publish: counted once in
	// ReloadErrors, however often it is retried.
	untranslatable *pools.File
	// released: the first-verdicts hold is over (it holds once, at a cold start).
	released    bool
	holdTimer   *time.Timer
	emptyLogged bool
	cancelWatch context.CancelFunc
	fileCh      chan struct{} // poked when the file in service changes (the leader retargets)
}

// New returns a replica of cfg on cli, serving with an xds.Server built with opts. It
// serves nothing until Run has read the store.
func New(ctx context.Context, cfg Config, cli *clientv3.Client, log *zap.Logger, opts ...xds.Option) *Replica {
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	r := &Replica{cfg: cfg, cli: cli, log: log.With(zap.String("replica", cfg.ID)),
		gate: NewGate("reading the store"), started: time.Now(), fileCh: make(chan struct{}, 1)}
	r.served.Store(&store.State{Verdicts: map[store.VerdictKey]store.Verdict{}})
	r.lastOK.Store(time.Now().UnixNano())
	opts = append(opts, xds.WithReplicaStatus(r.Status))
	r.srv = xds.NewServer(ctx, &pools.File{Filename: "store"}, r.view, log, opts...)
	return r
}

// Server is the replica's xDS server (register it on the gRPC server whose stream
// interceptor is Gate's).
func (r *Replica) Server() *xds.Server { return r.srv }

// Gate admits and ends the xDS streams.
func (r *Replica) Gate() *Gate { return r.gate }

// view is the health view of the state in service: the stored verdicts only.
func (r *Replica) view(service string, b *pools.Backend) health.State {
	v, _ := r.served.Load().Verdict(service, b.Identity())
	return v.State
}

// Run follows the store and takes part in the election until ctx ends.
func (r *Replica) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, loop := range []func(context.Context){r.heartbeat, r.follow, r.elect} {
		wg.Add(1)
		go func() { defer wg.Done(); loop(ctx) }()
	}
	wg.Wait()
}

// exchanged notes a successful exchange with etcd.
func (r *Replica) exchanged() { r.lastOK.Store(time.Now().UnixNano()) }

// heartbeat reads the election's members (a linearizable read, which needs the store's
// quorum) a few times per store timeout, and stops serving when no exchange with etcd
// has succeeded for the store timeout.
func (r *Replica) heartbeat(ctx context.Context) {
	every := min(r.cfg.StoreTimeout/5, time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		hctx, cancel := context.WithTimeout(ctx, max(every, time.Second))
		ms, _, err := store.Members(hctx, r.cli, r.cfg.Keys)
		cancel()
		if err == nil {
			r.exchanged()
			r.members.Store(&ms)
		}
		if since := time.Since(time.Unix(0, r.lastOK.Load())); since > r.cfg.StoreTimeout && r.connected.Load() {
			r.lose(fmt.Sprintf("no answer from etcd for %s (--store-timeout %s)", since.Round(time.Millisecond), r.cfg.StoreTimeout))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// lose stops serving until the state has been read again. It holds mu, as install does
// when it opens the gate, so an install under way cannot open it again after this.
func (r *Replica) lose(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.connected.Store(false)
	r.gate.Close("lost the store: " + why)
	r.log.Error("lost the store: ending every xDS stream and refusing new ones until etcd answers", zap.String("why", why))
	if r.cancelWatch != nil {
		r.cancelWatch()
	}
}

// follow reads the whole state, serves it, and follows it by watch; it reads it whole
// again after any break (a lost store, a compacted revision, a member without a leader).
func (r *Replica) follow(ctx context.Context) {
	for ctx.Err() == nil {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, rev, err := store.Load(lctx, r.cli, r.cfg.Keys)
		cancel()
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(retryEvery):
			}
			continue
		}
		r.exchanged()
		wctx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
		r.mu.Lock()
		r.cancelWatch = stop
		if !r.connected.Swap(true) {
			r.log.Info("store read", zap.Int64("revision", st.Revision))
		}
		r.mu.Unlock()
		r.install(st)
		for resp := range r.cli.Watch(wctx, r.cfg.Keys.State(), clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
			if err := resp.Err(); err != nil {
				r.log.Warn("watching the store: reading it again", zap.Error(err))
				break
			}
			r.exchanged()
			if len(resp.Events) > 0 {
				st = st.Apply(r.cfg.Keys, resp.Events)
				r.install(st)
			}
		}
		stop()
	}
}

// install serves st: it parses a new document, holds a cold start's first view until the
// stored verdicts are in, publishes at st's revision and opens the gate.
func (r *Replica) install(st *store.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.latest = st
	if len(st.Bad) > 0 {
		r.log.Warn("skipping keys of the store that do not parse", zap.Strings("keys", st.Bad))
	}
	if st.Doc == nil || len(st.Doc.YAML) == 0 {
		reason := fmt.Sprintf("the store holds no pools file under %s: load one with `stickylb pools apply FILE --etcd ...`", r.cfg.Keys.Pools())
		if !r.emptyLogged {
			r.log.Error("refusing xDS streams: " + reason)
			r.emptyLogged = true
		}
		r.gate.Close(reason)
		return
	}
	r.emptyLogged = false
	if st.Doc.Revision != r.fileRev {
		name := fmt.Sprintf("etcd:%s@%d", r.cfg.Keys.Pools(), st.Doc.Revision)
		f, err := pools.Parse(name, st.Doc.YAML)
		if err != nil {
			// Stored through `pools apply` or the API, both of which validate: a replica of
			// another version may read it otherwise. The last good file keeps serving.
			r.srv.Stats.ReloadErrors.Add(1)
			r.log.Error("the stored pools file does not parse here; serving the last good one", zap.Error(err))
		} else {
			r.file, r.fileRev = f, st.Doc.Revision
			select {
			case r.fileCh <- struct{}{}:
			default:
			}
		}
	}
	if r.file == nil {
		r.gate.Close("the stored pools file does not parse (see the log)")
		return
	}
	if !r.releasedLocked(st) {
		r.gate.Close("waiting for the first health verdicts of a cold start")
		return
	}
	if st.Revision != r.served.Load().Revision || r.file != r.published {
		if err := r.srv.UpdateAt(r.file, int(st.Revision), func() { r.serve(st) }); err != nil {
			if r.file != r.untranslatable {
				r.untranslatable = r.file
				r.srv.Stats.ReloadErrors.Add(1) // the server counts no refusal: its caller does
			}
			r.log.Error("publishing the stored state", zap.Int64("revision", st.Revision), zap.Error(err))
			return
		}
	}
	if r.connected.Load() {
		r.gate.Open()
	}
}

// serve makes st the state the server's health view reads, and hands the server the
// times of the verdicts that changed (health_since, the state left, the reason).
func (r *Replica) serve(st *store.State) {
	prev := r.served.Load()
	for k, v := range st.Verdicts {
		if old, ok := prev.Verdicts[k]; ok && old == v {
			continue
		}
		r.srv.RecordTransition(k.Service, health.Transition{ID: k.ID, To: v.State, Healthy: v.State == health.Healthy,
			From: v.From, At: v.Since, Reason: v.Reason})
	}
	r.served.Store(st)
	r.published = r.file
}

// releasedLocked reports whether the first-verdicts hold is over: once every
// health-checked backend of the file has a stored verdict, or the checks' first-verdict
// bound (plus slack) has passed since the replica started. A warm restart, with the
// verdicts stored, does not hold at all.
func (r *Replica) releasedLocked(st *store.State) bool {
	if r.released {
		return true
	}
	var bound time.Duration
	missing := 0
	for _, svc := range pools.HealthServices(r.file.Services) {
		bound = max(bound, svc.Config.FirstVerdictWithin()+firstVerdictSlack)
		for _, t := range svc.Targets {
			if _, ok := st.Verdict(svc.Name, t.ID); !ok {
				missing++
			}
		}
	}
	wait := time.Until(r.started.Add(bound))
	if missing == 0 || wait <= 0 {
		r.released = true
		if missing > 0 {
			r.log.Warn("first health verdicts not all stored within their bound: serving, the missing ones UNKNOWN (routable)", zap.Int("missing", missing))
		}
		return true
	}
	if r.holdTimer == nil {
		r.holdTimer = time.AfterFunc(wait, func() {
			r.mu.Lock()
			st := r.latest
			r.mu.Unlock()
			r.install(st)
		})
	}
	return false
}
