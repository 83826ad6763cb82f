package caddymodule

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/stickylb/stickylb/policies/balance"
)

func init() {
	caddy.RegisterModule(new(WeightedLeastConn))
}

// WeightedLeastConn sends each request to the available upstream with the fewest in-flight
// requests per unit of weight, reading in-flight counts from Caddy's own per-upstream
// counters (so requests of every handler and every policy count). Ties, common under light
// load, go round robin by weight, so weights hold at any load. With slow start, an upstream
// that joins the pool or turns healthy ramps up over a window with Envoy's formula.
type WeightedLeastConn struct {
	// Weights, positional: the i-th weight belongs to the i-th upstream (as Caddy's
	// weighted_round_robin). Upstreams past the list weigh 1.
	Weights []int `json:"weights,omitempty"`
	// WeightsByAddress gives weights by upstream dial address; it overrides Weights.
	WeightsByAddress map[string]int `json:"weights_by_address,omitempty"`
	// SlowStart is the ramp-up window; 0 (default) turns slow start off.
	SlowStart caddy.Duration `json:"slow_start,omitempty"`
	// Aggression shapes the ramp: weight × (t/window)^(1/aggression). Default 1 (linear).
	Aggression float64 `json:"aggression,omitempty"`
	// MinWeightPercent floors the ramp at this share of the weight. Default 10.
	MinWeightPercent *float64 `json:"min_weight_percent,omitempty"`
	// Clocks names the slow-start clock store; handlers sharing a name share the clocks.
	// Default: one store per distinct configuration.
	Clocks string `json:"clocks,omitempty"`

	// turn rotates ties among equally weighted upstreams, ties is how many the last scan
	// found (selectUniform).
	turn, ties atomic.Uint64
	// mu guards the scan's scratch and the tie-break credits, by pool position.
	mu       sync.Mutex
	load     []float64 // per position: in-flight / weight, or -1 when not eligible
	weights  []float64 // per position: the weight the scan used
	credit   []float64 // smooth weighted round robin among ties (nginx's), per position
	ss       balance.SlowStart
	clocks   *clockStore
	clockKey string
	now      func() time.Time
	picks    pickLog
}

// CaddyModule returns the Caddy module information.
func (*WeightedLeastConn) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.weighted_least_conn",
		New: func() caddy.Module { return new(WeightedLeastConn) },
	}
}

// Defaults of weighted_least_conn's slow start (Envoy's).
const (
	defaultAggression       = 1.0
	defaultMinWeightPercent = 10.0
)

// Provision sets up the policy.
func (p *WeightedLeastConn) Provision(ctx caddy.Context) error {
	p.now = time.Now
	p.picks = pickLog(mayRetry(ctx))
	aggr := p.Aggression
	if aggr == 0 {
		aggr = defaultAggression
	}
	minPct := defaultMinWeightPercent
	if p.MinWeightPercent != nil {
		minPct = *p.MinWeightPercent
	}
	p.ss = balance.SlowStart{Window: time.Duration(p.SlowStart), Aggression: aggr, MinWeightPercent: minPct}
	if p.SlowStart > 0 {
		p.clockKey = p.Clocks
		if p.clockKey == "" {
			p.clockKey = fmt.Sprintf("wlc:%v:%v:%s:%g:%g", p.Weights, p.WeightsByAddress, time.Duration(p.SlowStart), aggr, minPct)
		}
		v, loaded, err := clockPool.LoadOrNew(p.clockKey, func() (caddy.Destructor, error) {
			return newClockStore(), nil
		})
		if err != nil {
			return err
		}
		p.clocks = v.(*clockStore)
		// Upstreams of the very first config are not ramped (Envoy does not slow-start a
		// cluster's initial hosts); on a reload the store already exists and new ones are.
		p.clocks.noteInstance(!loaded)
		registerMetrics(ctx)
	}
	return nil
}

// Validate checks the configuration.
func (p *WeightedLeastConn) Validate() error {
	for i, w := range p.Weights {
		if w < 0 {
			return fmt.Errorf("weighted_least_conn: weight #%d is negative (%d)", i+1, w)
		}
	}
	for a, w := range p.WeightsByAddress {
		if w < 0 {
			return fmt.Errorf("weighted_least_conn: weight of %s is negative (%d)", a, w)
		}
	}
	if p.SlowStart < 0 {
		return fmt.Errorf("weighted_least_conn: slow_start must not be negative")
	}
	if err := p.ss.Validate(); err != nil {
		return fmt.Errorf("weighted_least_conn: %w", err)
	}
	return nil
}

// Cleanup releases the clock store.
func (p *WeightedLeastConn) Cleanup() error {
	if p.clocks != nil {
		_, _ = clockPool.Delete(p.clockKey)
	}
	return nil
}

// weight returns the weight of the i-th upstream: weights_by_address, else the control
// plane's (a stickylb_xds source), else the positional weights.
func (p *WeightedLeastConn) weight(i int, u *reverseproxy.Upstream) float64 {
	if w, ok := p.WeightsByAddress[identity(u)]; ok {
		return float64(w)
	}
	if w, ok := xdsTable.weight(identity(u)); ok {
		return w
	}
	if i < len(p.Weights) {
		return float64(p.Weights[i])
	}
	return 1
}

// Select returns the eligible upstream with the least in-flight requests per weight. Ties,
// the rule at light load, go to nginx's smooth weighted round robin, so every weight holds
// and no upstream is favoured by its position. The scan is written out here rather than
// through a per-candidate callback: it runs over the whole pool on every new session, so
// its cost per upstream is what makes it as cheap as Caddy's least_conn (which breaks ties
// with a random draw per tied upstream).
func (p *WeightedLeastConn) Select(pool reverseproxy.UpstreamPool, r *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	var vars map[string]any
	if p.picks {
		vars = requestVars(r)
	}
	t := p.picks.tried(vars)
	var now time.Time
	if p.clocks != nil {
		now = p.now()
	}
	if len(p.Weights) == 0 && len(p.WeightsByAddress) == 0 && p.clocks == nil && !xdsTable.hasWeights() {
		u := p.selectUniform(pool, t)
		p.picks.record(vars, u)
		return u
	}
	n := len(pool)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.credit) != n {
		// The pool changed shape: restart the tie order.
		p.credit, p.load, p.weights = make([]float64, n), make([]float64, n), make([]float64, n)
	}
	best := math.Inf(1)
	for i, u := range pool {
		p.load[i] = -1
		if u == nil || !usableForNew(u) || (!t.empty() && t.has(u)) {
			continue
		}
		base := p.weight(i, u)
		w := base
		if p.clocks != nil {
			since := p.clocks.observe(identity(u), u.Healthy(), now)
			w = p.ss.Weight(base, since, now)
			if w > 0 {
				p.clocks.record(identity(u), w/base)
			}
		}
		if w <= 0 {
			continue
		}
		l := float64(u.NumRequests()) / w
		p.load[i], p.weights[i] = l, w
		if l < best {
			best = l
		}
	}
	if math.IsInf(best, 1) {
		return nil
	}
	pick, total := -1, 0.0
	for i, l := range p.load {
		if l != best {
			continue
		}
		p.credit[i] += p.weights[i]
		total += p.weights[i]
		if pick < 0 || p.credit[i] > p.credit[pick] {
			pick = i
		}
	}
	p.credit[pick] -= total
	if p.clocks != nil {
		p.clocks.endRound()
	}
	// Recorded so that a retry of this request (directly under reverse_proxy, or as the
	// fallback of a sticky policy) skips it.
	p.picks.record(vars, pool[pick])
	return pool[pick]
}

// selectUniform is Select when every upstream weighs 1 (no weights, no slow start, no
// control-plane weights): the eligible upstream with the fewest in-flight requests, ties in
// turn by position, which is what the weighted scan's smooth round robin does with equal
// weights. One scan, no lock, no float: the turn is an atomic counter taken modulo the ties
// the previous scan found (while they stay the same, exactly round robin; when they change,
// a turn past the new ones goes to the first of them).
func (p *WeightedLeastConn) selectUniform(pool reverseproxy.UpstreamPool, t tried) *reverseproxy.Upstream {
	want := int((p.turn.Add(1) - 1) % uint64(max(1, p.ties.Load())))
	// usableForNew and the tried check, their loop invariants read once.
	drained, retry := !drains.empty.Load(), !t.empty()
	least, ties, pick, first := -1, 0, -1, -1
	for i, u := range pool {
		if u == nil || !u.Available() || (drained && drains.drained(identity(u))) || (retry && t.has(u)) {
			continue
		}
		n := u.NumRequests()
		if least < 0 || n < least {
			least, ties, pick, first = n, 0, -1, i
		}
		if n == least {
			if ties == want {
				pick = i
			}
			ties++
		}
	}
	if first < 0 {
		return nil
	}
	p.ties.Store(uint64(ties))
	if pick < 0 {
		pick = first
	}
	return pool[pick]
}

// clockStore remembers, per upstream, since when it has been in the pool and healthy, which
// slow start ramps from. Transitions are seen at Select, which visits every upstream.
type clockStore struct {
	mu     sync.RWMutex
	clocks map[string]*upstreamClock
	// baseline is true until the first Select of the config that created the store ends:
	// upstreams seen until then count as healthy since forever.
	baseline atomic.Bool
}

type upstreamClock struct {
	healthy atomic.Bool
	since   atomic.Int64  // UnixNano; 0 = since before stickylb saw it (no ramp)
	factor  atomic.Uint64 // math.Float64bits of the last slow-start factor, for metrics
}

func newClockStore() *clockStore { return &clockStore{clocks: map[string]*upstreamClock{}} }

// Destruct implements caddy.Destructor.
func (*clockStore) Destruct() error { return nil }

// noteInstance is called by each policy instance at provision; created says whether this
// instance created the store (first config) rather than loading it (a reload).
func (c *clockStore) noteInstance(created bool) {
	if created {
		c.baseline.Store(true)
	}
}

func (c *clockStore) endRound() { c.baseline.Store(false) }

// observe records u's health at now and returns since when it has been healthy (zero time
// when that is before the store saw it, meaning no ramp).
func (c *clockStore) observe(id string, healthy bool, now time.Time) time.Time {
	c.mu.RLock()
	cl := c.clocks[id]
	c.mu.RUnlock()
	if cl == nil {
		c.mu.Lock()
		if cl = c.clocks[id]; cl == nil {
			cl = &upstreamClock{}
			cl.healthy.Store(healthy)
			cl.factor.Store(floatBits(1))
			if !c.baseline.Load() {
				cl.since.Store(now.UnixNano()) // joined the pool now
			}
			c.clocks[id] = cl
		}
		c.mu.Unlock()
	}
	if was := cl.healthy.Load(); was != healthy && cl.healthy.CompareAndSwap(was, healthy) && healthy {
		cl.since.Store(now.UnixNano()) // turned healthy now
	}
	if s := cl.since.Load(); s != 0 {
		return time.Unix(0, s)
	}
	return time.Time{}
}

// record keeps the last slow-start factor of an upstream for the metrics.
func (c *clockStore) record(id string, factor float64) {
	c.mu.RLock()
	cl := c.clocks[id]
	c.mu.RUnlock()
	if cl != nil {
		cl.factor.Store(floatBits(factor))
	}
}

// factors returns the last slow-start factor per upstream.
func (c *clockStore) factors() map[string]float64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]float64, len(c.clocks))
	for id, cl := range c.clocks {
		out[id] = floatFromBits(cl.factor.Load())
	}
	return out
}

// parseWeights parses positional weights.
func parseWeights(args []string) ([]int, error) {
	out := make([]int, 0, len(args))
	for _, a := range args {
		w, err := strconv.Atoi(a)
		if err != nil {
			return nil, fmt.Errorf("invalid weight %q: %w", a, err)
		}
		if w < 0 {
			return nil, fmt.Errorf("invalid weight %d: must not be negative", w)
		}
		out = append(out, w)
	}
	return out, nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*WeightedLeastConn)(nil)
	_ caddy.Validator       = (*WeightedLeastConn)(nil)
	_ caddy.CleanerUpper    = (*WeightedLeastConn)(nil)
	_ reverseproxy.Selector = (*WeightedLeastConn)(nil)
)
