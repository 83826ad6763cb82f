// Package replica runs `stickylb xds` as one replica of a replicated control plane: the
// pools file and the health verdicts live in etcd (xds/store), every replica serves what
// it reads there, under the store revision as the version, and one replica at a time,
// elected through etcd, probes the backends and writes the verdicts.
package replica

import (
	"context"
	"fmt"
	"strconv"
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
	// StoreTimeout: with no successful exchange with etcd for this long, or a store watch
	// that has not caught up for this long with what a read saw, the replica stops
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
	// servedC is closed when served changes (and replaced): what a resuming node's
	// stream waits on while the replica catches up with it.
	servedC atomic.Pointer[chan struct{}]
	// targets are the probe targets (store.ProbeTarget) of the checked backends of the
	// file in service: a stored verdict of another target is not theirs.
	targets atomic.Pointer[map[store.VerdictKey]string]
	// connected: the replica has read the whole state since it last lost the store.
	connected atomic.Bool
	lastOK    atomic.Int64 // unix nanoseconds of the last successful exchange with etcd
	// watchRev is the newest revision the store watch has reported (with events or as
	// progress); the read revision of the load it started from.
	watchRev atomic.Int64
	leading  atomic.Bool
	// mon is the leader's health monitor while it leads (the status page's last probes).
	mon atomic.Pointer[health.Monitor]
	// reconciled is when the leader last compared its checkers with the stored verdicts
	// (unix nanoseconds); holding counts the resuming streams waiting in caughtUp.
	reconciled atomic.Int64
	holding    atomic.Int32
	members    atomic.Pointer[[]store.Member]
	started    time.Time

	mu sync.Mutex // guards the fields below and orders installs
	// file is the pools file in service and the document revision it was parsed from.
	file    *pools.File
	fileRev int64
	// badRev is a stored document revision that does not parse here (0: none), badErr why:
	// logged once, shown on the status page, not parsed again.
	badRev int64
	badErr string
	// published is the file of the server's current version.
	published *pools.File
	latest    *store.State // the newest state read, served or not
	// untranslatable is the last file the server refused to publish: counted once in
	// ReloadErrors, however often it is retried.
	untranslatable *pools.File
	// released: the first-verdicts hold is over (it holds once, at a cold start).
	released    bool
	holdTimer   *time.Timer
	stopped     bool // Run has returned: the hold timer installs nothing
	emptyLogged bool
	cancelWatch context.CancelFunc
	watchCtx    context.Context // the watch's (RequestProgress must name its stream)
	fileCh      chan struct{}   // poked when the file in service changes (the leader retargets)
	markCh      chan struct{}   // poked when the state read is Unmarked (the leader marks it)
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
		gate: NewGate("reading the store"), started: time.Now(),
		fileCh: make(chan struct{}, 1), markCh: make(chan struct{}, 1)}
	r.served.Store(&store.State{Verdicts: map[store.VerdictKey]store.Verdict{}})
	c := make(chan struct{})
	r.servedC.Store(&c)
	r.targets.Store(&map[store.VerdictKey]string{})
	r.lastOK.Store(time.Now().UnixNano())
	opts = append(opts, xds.WithReplicaStatus(r.Status), xds.WithProbes(r.probes), xds.WithResumeWait(r.caughtUp),
		xds.WithReadiness(r.ready))
	r.srv = xds.NewServer(ctx, &pools.File{Filename: "store"}, r.view, log, opts...)
	return r
}

// Server is the replica's xDS server (register it on the gRPC server whose stream
// interceptor is Gate's).
func (r *Replica) Server() *xds.Server { return r.srv }

// Gate admits and ends the xDS streams.
func (r *Replica) Gate() *Gate { return r.gate }

// view is the health view of the state in service: the stored verdicts only, each for
// the probe target it was decided on.
func (r *Replica) view(service string, b *pools.Backend) health.State {
	k := store.VerdictKey{Service: service, ID: b.Identity()}
	v, ok := r.served.Load().Verdicts[k]
	if !ok || !v.Stands((*r.targets.Load())[k]) {
		return health.Unknown
	}
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
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	if r.holdTimer != nil {
		r.holdTimer.Stop()
	}
}

// exchanged notes a successful exchange with etcd.
func (r *Replica) exchanged() { r.lastOK.Store(time.Now().UnixNano()) }

// heartbeat reads the election's members (a linearizable read, which needs the store's
// quorum) a few times per store timeout and asks the watch for its progress. It stops
// serving when no exchange with etcd has succeeded for the store timeout, or when the
// watch has not reached the revision a read saw within the store timeout (a stalled
// watch, which leaves reads working while the state served grows old).
func (r *Replica) heartbeat(ctx context.Context) {
	every := min(r.cfg.StoreTimeout/5, time.Second)
	var behind int64       // a read's revision the watch had not reached, 0: none
	var behindAt time.Time // when that read was
	for {
		// While the replica serves, a read is bounded by what remains of the store timeout:
		// the stop comes at the timeout, not a read's timeout after it.
		connected := r.connected.Load()
		timeout := max(every, time.Second)
		if connected {
			left := time.Until(time.Unix(0, r.lastOK.Load()).Add(r.cfg.StoreTimeout))
			timeout = min(timeout, max(left, time.Millisecond))
		}
		hctx, cancel := context.WithTimeout(ctx, timeout)
		ms, rev, err := store.Members(hctx, r.cli, r.cfg.Keys)
		cancel()
		if err == nil {
			r.exchanged()
			r.members.Store(&ms)
			r.requestProgress()
		}
		switch {
		case !r.connected.Load():
			behind = 0
		case behind != 0 && r.watchRev.Load() >= behind:
			behind = 0
		}
		if err == nil && behind == 0 && r.connected.Load() && r.watchRev.Load() < rev {
			behind, behindAt = rev, time.Now()
		}
		wait := every
		if r.connected.Load() {
			since := time.Since(time.Unix(0, r.lastOK.Load()))
			switch {
			case since >= r.cfg.StoreTimeout:
				r.lose(fmt.Sprintf("no answer from etcd for %s (--store-timeout %s)", since.Round(time.Millisecond), r.cfg.StoreTimeout))
			case behind != 0 && time.Since(behindAt) >= r.cfg.StoreTimeout:
				r.lose(fmt.Sprintf("the store watch has not reached revision %d, which a read saw %s ago (--store-timeout %s): it has stalled",
					behind, time.Since(behindAt).Round(time.Millisecond), r.cfg.StoreTimeout))
			default:
				// Wake at the next beat, or at the moment the store timeout runs out.
				wait = min(wait, r.cfg.StoreTimeout-since)
				if behind != 0 {
					wait = min(wait, time.Until(behindAt.Add(r.cfg.StoreTimeout)))
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, time.Millisecond)):
		}
	}
}

// requestProgress asks etcd to report the watch's progress: a progress notification
// comes once the watch has sent every event up to the member's revision.
func (r *Replica) requestProgress() {
	r.mu.Lock()
	wctx := r.watchCtx
	r.mu.Unlock()
	if wctx == nil {
		return
	}
	// The request names the watch's stream by its context's metadata: a context derived
	// from the watch's carries it.
	pctx, cancel := context.WithTimeout(wctx, time.Second)
	defer cancel()
	_ = r.cli.RequestProgress(pctx)
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
		r.cancelWatch, r.watchCtx = stop, wctx
		r.watchRev.Store(rev)
		if !r.connected.Swap(true) {
			r.log.Info("store read", zap.Int64("revision", st.Revision))
		}
		r.installLocked(st, true)
		r.mu.Unlock()
		for resp := range r.cli.Watch(wctx, r.cfg.Keys.State(), clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithProgressNotify()) {
			if err := resp.Err(); err != nil {
				r.log.Warn("watching the store: reading it again", zap.Error(err))
				break
			}
			r.exchanged()
			if resp.Header.Revision > r.watchRev.Load() {
				r.watchRev.Store(resp.Header.Revision)
			}
			if len(resp.Events) > 0 {
				st = st.Apply(r.cfg.Keys, resp.Events)
				r.install(st)
			}
		}
		stop()
		r.mu.Lock()
		r.watchCtx = nil
		r.mu.Unlock()
	}
}

// install serves st (see installLocked).
func (r *Replica) install(st *store.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.installLocked(st, false)
}

// installLocked serves st: it parses a new document, holds a cold start's first view
// until the stored verdicts are in, publishes at st's revision and opens the gate. A
// state older than the newest one read is ignored (the version served never goes back),
// unless it is a whole read of the store (fresh), which is the truth whatever came before.
func (r *Replica) installLocked(st *store.State, fresh bool) {
	if cur := r.latest; cur != nil && st.Revision < cur.Revision {
		if !fresh {
			return
		}
		r.log.Warn("the store's revision went back (a snapshot restored without --bump-revision?): serving it",
			zap.Int64("was", cur.Revision), zap.Int64("now", st.Revision))
	}
	r.latest = st
	if st.Unmarked {
		poke(r.markCh)
	}
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
	r.parseLocked(st.Doc)
	if r.file == nil {
		r.gate.Close(fmt.Sprintf("the stored pools file (revision %d) does not parse here: %s", r.badRev, r.badErr))
		return
	}
	if !r.releasedLocked(st) {
		r.gate.Close("waiting for the first health verdicts of a cold start")
		return
	}
	if st.Revision != r.served.Load().Revision || r.file != r.published {
		if err := r.srv.UpdateAt(r.file, int(st.Revision), func() { r.serve(st) }); err != nil {
			if r.file != r.untranslatable { // counted and logged once, not at every store event
				r.untranslatable = r.file
				r.srv.Stats.ReloadErrors.Add(1) // the server counts no refusal: its caller does
				r.log.Error("publishing the stored state", zap.Int64("revision", st.Revision), zap.Error(err))
			}
			return
		}
	}
	if r.connected.Load() {
		r.gate.Open()
	}
}

// parseLocked makes doc the file in service when it is a new revision that parses. A
// revision that does not parse is logged once and not parsed again; the last good file
// keeps serving.
func (r *Replica) parseLocked(doc *store.Document) {
	if doc.Revision == r.fileRev || doc.Revision == r.badRev {
		return
	}
	f, err := pools.Parse(fmt.Sprintf("etcd:%s@%d", r.cfg.Keys.Pools(), doc.Revision), doc.YAML)
	if err != nil {
		// Stored through `pools apply` or the API, both of which validate: a replica of
		// another version may read it otherwise, or it was written past them (etcdctl).
		r.badRev, r.badErr = doc.Revision, err.Error()
		r.srv.Stats.ReloadErrors.Add(1)
		r.log.Error("the stored pools file does not parse here; serving the last good one", zap.Int64("document_revision", doc.Revision),
			zap.Int64("serving_revision", r.fileRev), zap.Error(err))
		return
	}
	r.file, r.fileRev, r.badRev, r.badErr = f, doc.Revision, 0, ""
	targets := map[store.VerdictKey]string{}
	for _, svc := range pools.HealthServices(f.Services) {
		for _, t := range svc.Targets {
			targets[store.VerdictKey{Service: svc.Name, ID: t.ID}] = store.ProbeTarget(svc.Config, t.Address)
		}
	}
	r.targets.Store(&targets)
	poke(r.fileCh)
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
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
	next := make(chan struct{})
	close(*r.servedC.Swap(&next))
}

// caughtUp returns once the replica serves version (the version a node resuming on a new
// stream has ACKed, from another replica) or a later one, so that the node is never
// sent a version older than the one it holds while this replica's watch catches up; or
// when the gate closes (the stream ends), or after the store timeout (by which a replica
// whose watch stalled has stopped serving), when the node gets what is served.
func (r *Replica) caughtUp(version string) {
	want, err := strconv.ParseInt(version, 10, 64)
	if err != nil || r.served.Load().Revision >= want {
		return
	}
	r.holding.Add(1)
	defer r.holding.Add(-1)
	deadline := time.NewTimer(r.cfg.StoreTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond) // the gate's closing has no channel here
	defer tick.Stop()
	for {
		changed := *r.servedC.Load()
		if r.served.Load().Revision >= want {
			return
		}
		if open, _ := r.gate.State(); !open {
			return
		}
		select {
		case <-changed:
		case <-tick.C:
		case <-deadline.C:
			r.log.Warn("a resuming node holds a version this replica has not caught up with: sending the older one",
				zap.Int64("node_version", want), zap.Int64("serving", r.served.Load().Revision))
			return
		}
	}
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
		bound = max(bound, svc.Config.FirstVerdictWithin()+xds.FirstVerdictSlack)
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
			// Under mu from reading the newest state to serving it: an install between the
			// two would be undone by an older one.
			r.mu.Lock()
			defer r.mu.Unlock()
			if !r.stopped && r.latest != nil {
				r.installLocked(r.latest, false)
			}
		})
	}
	return false
}
