// When an apply or a rebuild fails part-way for a reason that can pass: retrying it, and
// saying whether the node's tables are behind the rest of its fleet's meanwhile.

package l4xdp

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/pools"
)

// Retries of a failed apply: the first after retryFirst, each wait twice the last, at most
// retryMax. A retry holds no lock while it waits for neighbours (see retryLocked), so a
// short bound costs a neighbour-table read and a datagram per missing backend.
const (
	retryFirst = 500 * time.Millisecond
	retryMax   = 4 * time.Second
	// retryResolve is how long a retry waits for the neighbours it asks for, unlocked.
	retryResolve = 300 * time.Millisecond
)

// ErrNotForwarding marks what Forwarding finds for certain: the interface is gone, down or
// without carrier, or the program is no longer attached to it. Other errors of Forwarding
// (a netlink or map read that failed) may pass at the next look.
var ErrNotForwarding = errors.New("not forwarding")

// ErrStale marks Stale's answer: the tables are behind the config this loader was given.
var ErrStale = errors.New("the tables are stale")

// notForwarding is a certain reason the program cannot forward.
type notForwarding struct{ msg string }

func (e notForwarding) Error() string      { return e.msg }
func (notForwarding) Is(target error) bool { return target == ErrNotForwarding }

// staleError says why the tables are behind the config.
type staleError struct{ err error }

func (e staleError) Error() string      { return "the tables are behind the config: " + e.err.Error() }
func (e staleError) Unwrap() error      { return e.err }
func (staleError) Is(target error) bool { return target == ErrStale }

// transientError marks a failure of an apply that may pass on a retry: a backend's MAC not
// resolved yet, a netlink read, a map write. local: a map write of this node's own,
// whatever its link (see settleLocked). Every other failure is a refusal of the config,
// which every node makes alike.
type transientError struct {
	err   error
	local bool
}

func (e transientError) Error() string { return e.err.Error() }
func (e transientError) Unwrap() error { return e.err }

// transient marks err (nil stays nil).
func transient(err error, local bool) error {
	if err == nil {
		return nil
	}
	return transientError{err: err, local: local}
}

// isTransient says whether an apply's error may pass on a retry; local, whether it was a
// write of this node's own maps.
func isTransient(err error) (ok, local bool) {
	var te transientError
	if !errors.As(err, &te) {
		return false, false
	}
	// A joined error is local if any of its parts is.
	var walk func(error) bool
	walk = func(e error) bool {
		if t, ok := e.(transientError); ok && t.local {
			return true
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				if walk(x) {
					return true
				}
			}
		}
		if u := errors.Unwrap(e); u != nil {
			return walk(u)
		}
		return false
	}
	return true, walk(err)
}

// Stale says why the loader's tables are behind the config it was given last, nil while
// they hold it: the last apply or rebuild failed for a reason of this node's own (its link
// carried no traffic when a backend's MAC had to be resolved, or a map write failed), so
// the rest of a fleet, which read the same config, holds other tables. An announcer
// withdraws the node meanwhile: a flow a router moves to it would meet another backend.
// The loader retries until an apply succeeds. A failure every node makes alike (a config
// refused, a neighbour none of them can resolve with its link up) is not stale: the node's
// tables are the fleet's, the last good ones.
//
// A loader that probes its backends itself is stale, too, for a while after its link came
// back (as Forwarding saw it): the verdicts its checks reached while the link was down say
// nothing of the backends (every one of them failed its probes), and until they have
// probed again (each service's healthy threshold times its interval, and its timeout) its
// tables are not the fleet's: a router that routes to it again at once would send flows
// to other backends than the rest of the fleet does.
func (l *Loader) Stale() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed != nil && l.failedStale {
		return staleError{l.failed}
	}
	if l.external == nil && !l.linkBack.IsZero() && l.file != nil {
		if until := l.linkBack.Add(reprobeWithin(l.file)); l.now().Before(until) {
			return staleError{fmt.Errorf("the link of %s came back at %s: the health checks probe the backends again until %s",
				l.cfg.Iface, l.linkBack.Format(time.RFC3339Nano), until.Format(time.RFC3339Nano))}
		}
	}
	return nil
}

// reprobeWithin bounds how long a running checker of f's services takes to find a backend
// healthy again after its probes failed: the healthy threshold's probes, the last one's
// timeout, and slack for the rebuild.
func reprobeWithin(f *pools.File) time.Duration {
	var d time.Duration
	for _, s := range pools.HealthServices(vipServices(f)) {
		c := s.Config.WithDefaults()
		d = max(d, time.Duration(c.HealthyThreshold)*c.Interval+c.Timeout+250*time.Millisecond)
	}
	return d
}

// noteLink records what Forwarding found of the link: down for certain, or back up.
func (l *Loader) noteLink(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case errors.Is(err, ErrNotForwarding):
		l.linkDown = true
	case err == nil && l.linkDown:
		l.linkDown, l.linkBack = false, l.now()
	}
}

// settleLocked records how an apply or rebuild of l.file went: nil, it holds; a failure
// (transient by then: the caller has refused the others) is retried after a growing wait,
// and makes the tables stale when it is this node's own (a map write, or the link down).
// retry says the apply was a retry (whose success the RetryApplied hook hears).
func (l *Loader) settleLocked(err error, retry bool) {
	prev := l.failed
	if err == nil {
		l.failed, l.failedStale, l.retryWait = nil, false, 0
		if prev != nil {
			l.log.Info("tables current again: a failed apply went through on retry", zap.Bool("retry", retry))
			if retry && l.cfg.RetryApplied != nil {
				l.cfg.RetryApplied()
			}
		}
		return
	}
	_, local := isTransient(err)
	stale := local || l.linkError() != nil
	// Once stale, stale until an apply succeeds: a link back up does not bring the edit.
	l.failed, l.failedStale = err, stale || (prev != nil && l.failedStale)
	l.retryWait = min(max(2*l.retryWait, retryFirst), retryMax)
	l.retryAt = l.now().Add(l.retryWait)
	if prev == nil || prev.Error() != err.Error() {
		l.log.Error("tables not updated; retrying", zap.Error(err), zap.Bool("stale", l.failedStale),
			zap.Duration("retry_in", l.retryWait))
	}
}

// retryDueLocked says whether a failed apply is to be retried now.
func (l *Loader) retryDueLocked(now time.Time) bool {
	return l.failed != nil && l.file != nil && !l.stoppingLocked() && !now.Before(l.retryAt)
}

// retry tries the failed apply of l.file again. It asks for the MACs it lacks first, and
// waits for them, without the loader's lock (rebuilds, the status page and the next edit
// wait on nothing), then applies under it, waiting for no MAC, if nothing has replaced the
// config meanwhile.
func (l *Loader) retry() {
	l.mu.Lock()
	f := l.file
	l.mu.Unlock()
	l.prefetch(f, retryResolve)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != f || l.failed == nil || l.stoppingLocked() {
		return
	}
	l.settleLocked(l.applyWaitLocked(f, 0), true)
}

// prefetch asks the kernel for the MACs of f's direct-routed backends that the neighbour
// table lacks, and waits up to wait for them. What it finds is not kept: the apply that
// follows reads the table again.
func (l *Loader) prefetch(f *pools.File, wait time.Duration) {
	served := vipServices(f)
	natted, err := l.planNAT(f, served)
	if err != nil {
		return
	}
	var direct []*pools.Backend
	for _, s := range served {
		for _, b := range s.Backends {
			if !natted[b] {
				direct = append(direct, b)
			}
		}
	}
	l.resolveMACs(direct, nil, wait) // an error here is the apply's to report
}

// linkError says, for certain, why the interface cannot carry traffic (gone, down, no
// carrier), nil when it can; another error when netlink could not tell.
func (l *Loader) linkError() error {
	if l.iface == nil {
		return nil // a loader of the tests' own, attached nowhere
	}
	lk, err := l.nl.LinkByIndex(l.iface.Index)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return notForwarding{fmt.Sprintf("interface %s is gone", l.cfg.Iface)}
		}
		return fmt.Errorf("interface %s: %w", l.cfg.Iface, err)
	}
	attrs := lk.Attrs()
	if attrs.Flags&net.FlagUp == 0 {
		return notForwarding{fmt.Sprintf("interface %s is down", l.cfg.Iface)}
	}
	if st := attrs.OperState; st == netlink.OperDown || st == netlink.OperLowerLayerDown || st == netlink.OperNotPresent {
		return notForwarding{fmt.Sprintf("interface %s has no carrier (%s)", l.cfg.Iface, st)}
	}
	return nil
}
