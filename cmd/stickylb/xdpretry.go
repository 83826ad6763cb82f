package main

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/stickylb/stickylb/l4xdp"
	"github.com/stickylb/stickylb/policies/pools"
)

// applyRetry applies pools-file edits to the loader and retries one that failed for what
// may pass (a backend's MAC not resolvable while the node's link is down) every
// applyRetryEvery, until it applies or a newer edit replaces it. Without it a node that
// missed an edit keeps its old tables until the next edit, and, announced again, sends the
// flows routers move to it elsewhere than the rest of the fleet does.
type applyRetry struct {
	ctx context.Context
	l   *l4xdp.Loader
	log *zap.Logger

	mu      sync.Mutex // held while applying: an edit and a retry never interleave
	pending *pools.File
}

const applyRetryEvery = 2 * time.Second

// newApplyRetry starts the retries; they end with ctx.
func newApplyRetry(ctx context.Context, l *l4xdp.Loader, log *zap.Logger) *applyRetry {
	r := &applyRetry{ctx: ctx, l: l, log: log}
	go r.run()
	return r
}

// apply is the pools.Watcher's Apply.
func (r *applyRetry) apply(f *pools.File) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.l.Apply(r.ctx, f)
	r.pending = nil
	if err != nil {
		r.pending = f
	}
	return err
}

func (r *applyRetry) run() {
	t := time.NewTicker(applyRetryEvery)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		if f := r.pending; f != nil {
			if err := r.l.Apply(r.ctx, f); err == nil {
				r.pending = nil
				r.log.Info("a pools-file edit that had failed applied on retry", zap.String("file", f.Filename))
			}
		}
		r.mu.Unlock()
	}
}
