package l4xdp

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/internal/healthlog"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// Loader attaches the forwarder to an interface and keeps its maps in step with a pools
// file and the health of its backends.
type Loader struct {
	cfg   Config
	log   *zap.Logger
	iface *net.Interface
	nl    *netlink.Handle // route netlink, in the namespace the loader was opened in
	maps  *Tables         // the loaded program and its maps: what apply writes, what stats read
	lnk   link.Link
	dir   string

	mu     sync.Mutex
	file   *pools.File
	slots  map[string]uint32 // "service/identity" -> backend slot (pinned in backend_names)
	vipIDs map[string]uint32 // service -> VIP id (pinned in vip_names)
	// lastDown: each backend's last health verdict, read back from the pinned flags by a
	// restarted loader. Until a (re)started checker has probed a backend, for its
	// first-verdict bound (holdUntil), this one holds: a dead backend does not get new flows
	// back for a restart or a pools-file edit. After that, Unknown is routable.
	lastDown  map[string]bool
	holdUntil time.Time
	// runCtx: the context of the last Apply, whose end stops the checkers (see
	// stoppingLocked).
	runCtx context.Context
	// healthLog logs the own checker's transitions, a prober fault once per cause.
	healthLog *healthlog.Logger
	health    *health.Monitor // one checker per VIP service with a health_check
	// external, when set, gives the verdicts instead of health (ApplyView: a loader fed by
	// a control plane probes nothing).
	external Verdicts
	// rampFrom: when each ramping backend's slow start began (its join, or its health
	// transition's time); rampBuilt: the ramp step its current tables were built for.
	rampFrom  map[string]time.Time
	rampBuilt map[string]int
	// seen: each backend's last health transition of the loader's own checker, gens: how
	// many distinct tables each VIP has had installed, and installed: the digest of the last
	// (the status page's since, reason and table generation).
	seen      map[string]health.Transition
	gens      map[string]uint64
	installed map[string]uint64
	// routed: the backends of the last apply reached by NAT or tunnel (the maintenance loop
	// keeps their next hops resolved).
	routed []*pools.Backend
	// tunnel4, tunnel6: the tunnel's source of each family (invalid: none).
	tunnel4, tunnel6 netip.Addr
	// forwarding4, forwarding6: forwarding is on for the tunnel's FIB lookups.
	forwarding4, forwarding6 bool
	// failed: why the last apply or rebuild of file failed, for what may pass (nil once one
	// succeeds); failedStale: it left the tables behind a fleet's (see Stale); retryAt,
	// retryWait: when the maintenance loop tries again, and how long it waited last.
	failed      error
	failedStale bool
	retryAt     time.Time
	retryWait   time.Duration
	// linkDown: Forwarding last found the interface down or without carrier; linkBack: when
	// it found it back (zero: never down). See Stale.
	linkDown bool
	linkBack time.Time
	// maintStop ends the loop that steps ramps and recounts active connections.
	maintStop, maintDone chan struct{}
}

// Tables returns the loaded program's maps (its counters).
func (l *Loader) Tables() *Tables { return l.maps }
