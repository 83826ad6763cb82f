package replica

import (
	"context"
	"errors"
	"maps"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/internal/healthlog"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds/store"
)

// reconcileEvery is how often a leader compares its checkers with the stored verdicts
// besides each transition (it retries a write the store did not take).
const reconcileEvery = time.Second

// elect campaigns for leadership on a session lease, leads while it holds, and campaigns
// again after losing it, until ctx ends.
func (r *Replica) elect(ctx context.Context) {
	ttl := max(int(r.cfg.LeaseTTL/time.Second), 1)
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(r.cli, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(retryEvery):
			}
			continue
		}
		cctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-sess.Done(): // the lease expired or could not be kept alive
				cancel()
			case <-cctx.Done():
			}
		}()
		e := concurrency.NewElection(sess, r.cfg.Keys.Election())
		if err := e.Campaign(cctx, r.cfg.ID); err == nil {
			r.lead(cctx, e)
			rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
			_ = e.Resign(rctx) // the next replica takes over now rather than at the lease's end
			rcancel()
		}
		cancel()
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = r.cli.Revoke(sctx, sess.Lease())
		scancel()
		sess.Orphan()
	}
}

// lead probes the backends of the file in service and writes every verdict that changes,
// fenced by e's key, until ctx ends or the fence refuses a write. It starts from the
// verdicts stored now, so no backend turns unknown or down because the leader changed,
// and a failover writes nothing.
func (r *Replica) lead(ctx context.Context, e *concurrency.Election) {
	fence := store.FenceOf(e)
	var known map[store.VerdictKey]store.Verdict
	for known == nil {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, _, err := store.Load(lctx, r.cli, r.cfg.Keys)
		cancel()
		if err == nil {
			known = maps.Clone(st.Verdicts)
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retryEvery):
		}
	}
	r.leading.Store(true)
	defer r.leading.Store(false)
	r.log.Info("leading: probing the backends and writing their verdicts", zap.Int("stored_verdicts", len(known)))
	defer r.log.Info("no longer leading")

	hlog := healthlog.New(r.log)
	poke := make(chan struct{}, 1)
	mon := health.NewMonitor(func(service string, tr health.Transition) {
		hlog.Transition(service, tr)
		select {
		case poke <- struct{}{}:
		default:
		}
	}, r.cfg.HealthOptions...)
	defer mon.Stop()
	r.mon.Store(mon)
	defer r.mon.Store(nil)
	var file *pools.File
	retarget := func() {
		r.mu.Lock()
		f := r.file
		r.mu.Unlock()
		if f == nil || f == file {
			return
		}
		file = f
		if err := mon.Apply(ctx, seeded(f, known)); err != nil {
			r.log.Error("retargeting health checks", zap.Error(err))
		}
	}
	retarget()
	t := time.NewTicker(reconcileEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.fileCh:
			retarget()
		case <-poke:
		case <-r.markCh:
		case <-t.C:
		}
		if err := r.markIfNeeded(ctx, fence); errors.Is(err, store.ErrNotLeader) {
			r.log.Warn("marking the state's revision was refused: another replica leads now")
			return
		}
		if file == nil {
			continue
		}
		puts, dels := diff(file, known, mon, r.cfg.ID)
		r.reconciled.Store(time.Now().UnixNano())
		if len(puts) == 0 && len(dels) == 0 {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := store.WriteVerdicts(wctx, r.cli, r.cfg.Keys, fence, puts, dels, store.Change{By: r.cfg.ID, Op: "verdicts"})
		cancel()
		switch {
		case errors.Is(err, store.ErrNotLeader):
			r.log.Warn("a verdict write was refused: another replica leads now")
			return
		case err != nil:
			r.log.Warn("writing verdicts (retried)", zap.Error(err))
			continue
		}
		maps.Copy(known, puts)
		for _, k := range dels {
			delete(known, k)
		}
	}
}

// markIfNeeded puts the revision key when the last write the replica read was another
// client's delete (store.State.Unmarked), so that every replica serves one version.
func (r *Replica) markIfNeeded(ctx context.Context, fence store.Fence) error {
	r.mu.Lock()
	unmarked := r.latest != nil && r.latest.Unmarked
	r.mu.Unlock()
	if !unmarked {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := store.MarkRevision(wctx, r.cli, r.cfg.Keys, fence, store.Change{By: r.cfg.ID, Op: "mark"})
	if err != nil && !errors.Is(err, store.ErrNotLeader) {
		r.log.Warn("marking the state's revision after another client's delete (retried)", zap.Error(err))
	}
	return err
}

// seeded are f's health-checked services as the monitor checks them, each target
// starting from its stored verdict when that was decided on the same probe target (a
// backend keyed by hash_key whose address or check changed is probed anew).
func seeded(f *pools.File, known map[store.VerdictKey]store.Verdict) []health.Service {
	services := pools.HealthServices(f.Services)
	for i := range services {
		for j := range services[i].Targets {
			t := &services[i].Targets[j]
			v, ok := known[store.VerdictKey{Service: services[i].Name, ID: t.ID}]
			if ok && v.Stands(store.ProbeTarget(services[i].Config, t.Address)) {
				t.Seed, t.SeedSince = v.State, v.Since
			}
		}
	}
	return services
}

// diff is what the store must take for the verdicts to be the checkers': the verdicts
// that changed (never one that did not), and the stored verdicts of backends no longer
// checked. A stored verdict of another probe target counts as none.
func diff(f *pools.File, known map[store.VerdictKey]store.Verdict, mon *health.Monitor, by string) (map[store.VerdictKey]store.Verdict, []store.VerdictKey) {
	puts := map[store.VerdictKey]store.Verdict{}
	checked := map[store.VerdictKey]bool{}
	for _, svc := range pools.HealthServices(f.Services) {
		for _, t := range svc.Targets {
			k := store.VerdictKey{Service: svc.Name, ID: t.ID}
			checked[k] = true
			ts, ok := mon.Lookup(svc.Name, k.ID)
			if !ok {
				continue
			}
			target := store.ProbeTarget(svc.Config, t.Address)
			old, stored := known[k]
			if stored && !old.Stands(target) {
				old, stored = store.Verdict{}, false
			}
			if ts.State == old.State && (stored || ts.State == health.Unknown) {
				continue
			}
			puts[k] = store.Verdict{State: ts.State, Since: ts.Since, From: old.State, Reason: ts.Reason, By: by, Target: target}
		}
	}
	var dels []store.VerdictKey
	for k := range known {
		if !checked[k] {
			dels = append(dels, k)
		}
	}
	return puts, dels
}
