// Bringing the maps to a pools file and to the health of its backends.

package l4xdp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/stickylb/stickylb/internal/healthlog"
	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// Apply installs f: backends, VIPs and their Maglev tables over the backends that may take
// new flows (alive, healthy or not yet checked, not draining). Flows already in the
// connection table keep their backend while it stays in the pool.
//
// An error that may pass (a backend's MAC not resolved yet, a map write) leaves f the
// config the loader holds to: it retries until f is installed (see Stale), and checks f's
// backends meanwhile. Any other error refuses f, and the last good config keeps serving.
func (l *Loader) Apply(ctx context.Context, f *pools.File) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.external = nil // the loader's own checks decide
	l.runCtx = ctx
	// A checker (re)started by this apply has probed nothing yet: until its first verdicts
	// can be in, a backend this loader had down stays down (see unhealthyLocked).
	l.holdUntil = time.Time{} // no checker, no hold, and no rebuild at its end
	if d := firstVerdictHold(f); d > 0 {
		l.holdUntil = l.now().Add(d)
	}
	err := l.applyWaitLocked(f, resolveWait)
	if ok, _ := isTransient(err); err != nil && !ok {
		return err
	}
	l.file = f
	l.settleLocked(err, false)
	l.startMaintenanceLocked(ctx)
	if herr := l.health.Apply(ctx, pools.HealthServices(vipServices(f))); herr != nil {
		return errors.Join(err, fmt.Errorf("health checks: %w", herr))
	}
	return err
}

// resolveWait is how long an apply of a new config waits for its backends' MACs.
const resolveWait = 3 * time.Second

// rebuildLocked builds l.file's tables again (a health transition, a ramp's step, a hold's
// end): its backends are installed, so it waits for no MAC; a failure is retried.
func (l *Loader) rebuildLocked(why string) {
	err := l.applyWaitLocked(l.file, 0)
	if ok, _ := isTransient(err); err != nil && !ok {
		err = transient(err, true) // a config that applied before: this node's own trouble
	}
	if err != nil {
		l.log.Error("rebuilding tables", zap.String("after", why), zap.Error(err))
	}
	l.settleLocked(err, false)
}

// vipServices are the services of f the forwarder serves, by name.
func vipServices(f *pools.File) []*pools.Service {
	var out []*pools.Service
	for _, s := range f.Services {
		if s.VIP != "" {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// applyWaitLocked brings the maps to f in two steps: first everything that can fail (MACs,
// names, ids), touching no map, so a bad edit leaves the running config whole; then the
// writes, service by service, and the removal of what left. Slots and ids survive edits and
// restarts, so the connection table stays right.
//
// It waits up to wait for MACs no backend has yet. Its errors that may pass on a retry are
// marked (isTransient): unresolved MACs, netlink reads, map writes.
func (l *Loader) applyWaitLocked(f *pools.File, wait time.Duration) error {
	served := vipServices(f)
	p, err := l.planSlotsLocked(served)
	if err != nil {
		return err
	}
	if err := l.planReachLocked(f, served, p, wait); err != nil {
		return err
	}
	w := &applyWrites{serverIDs: map[lbServerKey]uint32{}}
	for _, s := range served {
		l.installServiceLocked(s, p, w)
	}
	l.servedLocked(w.vips) // before the VIPs that leave are deleted: an announcer withdraws them first
	l.pruneLeaversLocked(p, w)
	l.slots, l.vipIDs = p.slots, p.ids
	return transient(errors.Join(w.errs...), true)
}

// applyPlan is what an apply decides before it writes a map: the slot of every backend and
// the id of every VIP service (kept from the running config, the lowest free one for a
// newcomer), each service's backends in file order, and which are reached by NAT.
type applyPlan struct {
	slots, ids         map[string]uint32 // "service/identity" -> slot; service -> VIP id
	slotAlloc, idAlloc *allocator
	backends           map[string][]plannedBackend // by service
	natted             natPlan
}

// applyWrites is what the writes of an apply leave behind: the VIPs and QUIC server_ids
// installed (the maps' others are pruned) and each write's error (one failing write does
// not stop the others).
type applyWrites struct {
	vips      []VIP
	serverIDs map[lbServerKey]uint32
	errs      []error
}

func (w *applyWrites) put(what string, err error) {
	if err != nil {
		w.errs = append(w.errs, fmt.Errorf("%s: %w", what, err))
	}
}

// planSlotsLocked gives every served service a VIP id and every backend a slot. Names that
// leave go first, so their slots and ids are free for newcomers.
func (l *Loader) planSlotsLocked(served []*pools.Service) (*applyPlan, error) {
	inFile := map[string]bool{}
	for _, s := range served {
		inFile[s.Name] = true
		for _, b := range s.Backends {
			inFile[s.Name+"/"+b.Identity()] = true
		}
	}
	kept := func(m map[string]uint32) map[string]uint32 {
		out := map[string]uint32{}
		for k, v := range m {
			if inFile[k] {
				out[k] = v
			}
		}
		return out
	}
	p := &applyPlan{slots: kept(l.slots), ids: kept(l.vipIDs), backends: map[string][]plannedBackend{}}
	p.idAlloc, p.slotAlloc = newAllocator(p.ids, 1, MaxVIPs), newAllocator(p.slots, 0, MaxBackends)
	for _, s := range served {
		if _, ok := p.idAlloc.get(s.Name); !ok {
			return nil, fmt.Errorf("service %s: more than %d VIP services", s.Name, MaxVIPs-1)
		}
		for _, b := range s.Backends {
			key := s.Name + "/" + b.Identity()
			if len(key) > maxName {
				return nil, fmt.Errorf("service %s: backend %s: %q is longer than the forwarder's %d-byte names", s.Name, b.Address, key, maxName)
			}
			slot, ok := p.slotAlloc.get(key)
			if !ok {
				return nil, fmt.Errorf("service %s: more than %d backends in all", s.Name, MaxBackends)
			}
			p.backends[s.Name] = append(p.backends[s.Name], plannedBackend{key: key, slot: slot, b: b})
		}
	}
	return p, nil
}

// planReachLocked decides how each backend of p is reached, DR or NAT, and finds what that
// needs: the MACs of DR backends (waiting up to wait for those with none, not even one
// installed; an error if one stays unknown) and the next hops of NAT backends. It waits
// (up to 3 s, under the loader's lock) only for NAT backends new to this apply: a health
// transition or a slow-start step must not stall on a next hop already asked for; the
// maintenance loop asks again for those.
func (l *Loader) planReachLocked(f *pools.File, served []*pools.Service, p *applyPlan, wait time.Duration) error {
	natted, err := l.planNAT(f, served)
	if err != nil {
		return err
	}
	if err := l.planTunnel(f, served); err != nil {
		return err
	}
	var direct, routed []*pools.Backend
	installed := map[*pools.Backend]net.HardwareAddr{}
	for _, s := range served {
		for _, pb := range p.backends[s.Name] {
			if natted[pb.b] || s.ForwardingOf(pb.b) == pools.ForwardingTunnel {
				routed = append(routed, pb.b)
				continue
			}
			direct = append(direct, pb.b)
			if slot, ok := l.slots[pb.key]; ok && slot == pb.slot {
				if hw := l.maps.slotMAC(slot); hw != nil {
					installed[pb.b] = hw
				}
			}
		}
	}
	macs, err := l.resolveMACs(direct, installed, wait)
	if err != nil {
		return transient(err, false)
	}
	known := map[string]bool{}
	for _, b := range l.routed {
		known[b.Address] = true
	}
	var fresh []*pools.Backend
	for _, b := range routed {
		if !known[b.Address] {
			fresh = append(fresh, b)
		}
	}
	l.resolveNextHops(fresh, 3*time.Second)
	l.routed = routed
	for _, ps := range p.backends {
		for i := range ps {
			ps[i].mac = macs[ps[i].b]
			if ps[i].mac == nil {
				ps[i].mac = make(net.HardwareAddr, 6) // NAT, tunnel: the FIB gives the next hop
			}
		}
	}
	p.natted = natted
	return nil
}

// installServiceLocked writes service s: its name, its backends, the weights of those that
// take its new flows on this node (zones, health, drain, slow start), and its VIP with the
// tables built over them.
func (l *Loader) installServiceLocked(s *pools.Service, p *applyPlan, w *applyWrites) {
	id := p.ids[s.Name]
	n, _ := toName(s.Name)
	w.put("naming VIP "+s.Name, l.maps.objs.VipNames.Put(id, n))
	if newIndex(l.vipIDs, s.Name, id) {
		w.put("zeroing the counters of VIP "+s.Name, l.maps.zeroCounter(l.maps.objs.VipStats, id))
	}
	now := l.now()
	var ms []member
	for _, pb := range p.backends[s.Name] {
		ms = append(ms, l.installBackendLocked(s, id, pb, p.natted[pb.b], now, w))
	}
	pick, global, panicking := candidates(ms, l.cfg.Zone, s.CrossZone)
	if panicking {
		l.log.Warn("every backend of the service is down: new flows go to all of them (panic)", zap.String("service", s.Name))
	}
	inPick := map[uint32]uint32{}
	for _, m := range pick {
		inPick[m.slot] = m.weight
	}
	for _, m := range ms {
		w.put("weight of "+s.Name+"/"+m.id, l.maps.SetWeight(m.slot, inPick[m.slot]))
	}
	vip, err := l.vipOf(s, id, pick, global, ms)
	if err != nil {
		w.errs = append(w.errs, err)
		return
	}
	if panicking {
		vip.Flags |= FlagPanic
	}
	if err := l.maps.SetVIP(vip); err != nil {
		w.put("VIP "+s.Name, err)
	} else {
		l.installedLocked(s.Name, vipDigest(vip, ms, inPick))
	}
	w.vips = append(w.vips, vip)
}

// installedLocked records that service's VIP now holds what digest d sums up. A rebuild that
// installs what was there (a hold's end, a verdict that moved nothing) is not a new
// generation: the status page's figure says when the table new flows follow changed.
func (l *Loader) installedLocked(service string, d uint64) {
	if d == l.installed[service] && l.gens[service] != 0 {
		return
	}
	if l.gens == nil {
		l.gens = map[string]uint64{}
		l.installed = map[string]uint64{}
	}
	l.gens[service]++
	l.installed[service] = d
}

// installBackendLocked writes backend pb of service s (VIP id) into its slot, reached by NAT
// or not, and returns it as the table builder sees it. A slot that changes hands, or whose
// backend is now reached the other way, gets a new generation: the connection table's
// entries for it are misses, and its flows re-pick.
func (l *Loader) installBackendLocked(s *pools.Service, id uint32, pb plannedBackend, nat bool, now time.Time, w *applyWrites) member {
	down := l.unhealthyLocked(s, pb.key, pb.b)
	bn, _ := toName(pb.key)
	w.put("naming backend "+pb.key, l.maps.objs.BackendNames.Put(pb.slot, bn))
	gen := l.maps.slotGen(pb.slot)
	reach := Backend{NAT: nat, Addr: pb.b.AddrPort()}
	if s.ForwardingOf(pb.b) == pools.ForwardingTunnel {
		reach = Backend{Tunnel: true, Addr: netip.AddrPortFrom(pb.b.AddrPort().Addr(), s.TunnelPort)}
	}
	newHands := newIndex(l.slots, pb.key, pb.slot)
	if wasNAT, addr, port := l.maps.slotReach(pb.slot); !newHands && (wasNAT != reach.NAT ||
		(reach.NAT && (addr != reach.Addr.Addr().Unmap().As16() || port != netOrder(reach.Addr.Port())))) {
		// Reached another way now (DR <-> NAT): the slot's flows re-pick, as when it
		// changes hands, rather than follow an entry made for the other way.
		gen++
	}
	if newHands {
		// The slot changes hands: entries of its previous backend are misses.
		gen++
		w.put("zeroing the counters of "+pb.key, l.maps.zeroCounter(l.maps.objs.BackendStats, pb.slot))
		w.put("zeroing the active connections of "+pb.key, l.maps.objs.Active.Put(pb.slot, int64(0)))
		if l.file != nil {
			l.joinedLocked(pb.key, l.joinTimeLocked(s, pb.b, now)) // a backend that joins ramps up
		}
	}
	w.put("zone of "+pb.key, l.maps.setZone(pb.slot, pb.b.Zone))
	w.put("backend "+pb.key, l.maps.SetBackend(pb.slot, Backend{MAC: pb.mac, Alive: true, Down: down, Gen: gen,
		NAT: reach.NAT, Tunnel: reach.Tunnel, Addr: reach.Addr}))
	if pb.b.ServerID != 0 {
		w.put("server_id of "+pb.key, l.maps.SetServerID(id, pb.b.ServerID, pb.slot))
		w.serverIDs[lbServerKey{VipId: id, ServerId: uint32(pb.b.ServerID)}] = pb.slot
	}
	weight, ramping := l.effectiveWeightLocked(s, pb.key, pb.b.Weight, now)
	return member{slot: pb.slot, id: pb.b.Identity(), zone: pb.b.Zone, weight: weight, ramping: ramping,
		down: down, drain: pb.b.Drain, zoneDrained: s.ZoneDrained(pb.b.Zone)}
}

// pruneLeaversLocked removes what is no longer in the file: VIPs and server_ids the apply did
// not install, and the backends and VIP names that left (their flows re-pick). A slot or id
// a newcomer took over in this same apply is the newcomer's now.
func (l *Loader) pruneLeaversLocked(p *applyPlan, w *applyWrites) {
	w.put("removing VIPs no longer in the file", l.maps.PruneVIPs(w.vips))
	w.put("removing server_ids no longer in the file", l.maps.PruneServerIDs(w.serverIDs))
	for key, slot := range l.slots {
		if _, ok := p.slots[key]; ok {
			continue
		}
		if !p.slotAlloc.used[slot] {
			w.put("removing backend "+key, l.maps.SetBackend(slot, Backend{MAC: make(net.HardwareAddr, 6), Alive: false, Gen: l.maps.slotGen(slot) + 1}))
			w.put("unnaming backend "+key, l.maps.objs.BackendNames.Put(slot, lbName{}))
		}
		delete(l.lastDown, key)
	}
	for name, id := range l.vipIDs {
		if _, ok := p.ids[name]; !ok && !p.idAlloc.used[id] {
			w.put("unnaming VIP "+name, l.maps.objs.VipNames.Put(id, lbName{}))
		}
	}
}

// vipOf builds service s's VIP: its key, affinity, and tables. With balance maglev the
// Maglev table spreads over pick (the backends new flows go to on this node); with
// weighted_round_robin and weighted_least_conn new flows follow a schedule over pick, and
// the Maglev table, for flows that started on another node, spreads over global. A tunnel
// service's table is the second-chance table over the same backends, the healthy draining
// ones of all (ms) as secondaries.
func (l *Loader) vipOf(s *pools.Service, id uint32, pick, global, all []member) (VIP, error) {
	vip, _ := s.VIPAddrPort()
	proto := uint8(6)
	if s.Protocol == pools.ProtocolUDP {
		proto = 17
	}
	size := s.Hash.TableSize // validation keeps vip services' tables within MaxTableSize
	if size == 0 || size > MaxTableSize {
		return VIP{}, fmt.Errorf("service %s: table_size %d: want 1..%d", s.Name, size, MaxTableSize)
	}
	v := VIP{ID: id, Addr: vip, Proto: proto, IdleTimeout: s.IdleTimeout}
	hashed := pick
	switch s.Balance {
	case pools.BalanceRoundRobin, pools.BalanceLeastConn:
		hashed = global
		v.Flags = FlagWRR
		if s.Balance == pools.BalanceLeastConn {
			v.Flags = FlagWLC
		}
		ws := make([]uint32, len(pick))
		for i, m := range pick {
			ws[i] = m.weight
			v.Pool = append(v.Pool, m.slot)
		}
		for _, i := range Schedule(ws) {
			v.Schedule = append(v.Schedule, pick[i].slot)
		}
	}
	var table []uint32
	var err error
	if s.Forwarding == pools.ForwardingTunnel {
		v.Flags |= FlagTunnel
		if s.SecondChance {
			v.Flags |= FlagSecondChance
		}
		table, v.Second, err = secondChanceTable(hashed, draining(all, hashed), size, s.SecondChance)
	} else {
		table, err = maglevTable(hashed, size)
	}
	if err != nil {
		return VIP{}, fmt.Errorf("service %s: %w", s.Name, err)
	}
	v.Table = table
	switch s.Affinity.Mode {
	case pools.ModeSourceIP:
		v.Flags |= FlagSourceIP
	case pools.ModeQUICCID:
		v.Flags, v.CIDLength = v.Flags|FlagQUIC, uint32(s.Affinity.QUICCID.CIDLength)
	}
	return v, nil
}

// maglevTable is the Maglev table of size slots over ms, as backend slots. Weights are the
// backends' own unless slow start holds one of them down (then every weight is in
// weightScale units, ramped), so a table with no ramp in progress is the one every tier
// builds from the pools file.
func maglevTable(ms []member, size uint64) ([]uint32, error) {
	table := make([]uint32, size)
	if len(ms) == 0 {
		for i := range table {
			table[i] = emptySlot
		}
		return table, nil
	}
	ws := tableWeights(ms)
	hosts := make([]chash.Host, len(ms))
	for i, m := range ms {
		hosts[i] = chash.Host{ID: m.id, Weight: ws[i]}
	}
	mt, err := chash.NewMaglev(hosts, size)
	if err != nil {
		return nil, err
	}
	for i, h := range mt.Table() {
		table[i] = ms[h].slot
	}
	return table, nil
}

// tableWeights are the weights a table is built with from ms: the backends' own unless slow
// start holds one of them down (then every weight is in weightScale units, ramped), so a
// table with no ramp in progress is the one every tier builds from the pools file.
func tableWeights(ms []member) []uint32 {
	ramping := false
	for _, m := range ms {
		ramping = ramping || m.ramping
	}
	ws := make([]uint32, len(ms))
	for i, m := range ms {
		ws[i] = m.weight
		if !ramping {
			ws[i] = max(1, (m.weight+weightScale/2)/weightScale)
		}
	}
	return ws
}

// firstVerdictHold is how long the checkers of f's vip services may take to give their
// first verdicts, with slack for a probe's timer and the transition's delivery on a loaded
// machine.
func firstVerdictHold(f *pools.File) time.Duration {
	var d time.Duration
	for _, s := range pools.HealthServices(vipServices(f)) {
		d = max(d, s.Config.FirstVerdictWithin()+250*time.Millisecond)
	}
	return d
}

// unhealthyLocked: the checker's verdict; Unknown is routable (health.State.Routable, as on
// every tier), except while a (re)started checker has not probed the backend yet: for its
// first-verdict bound, the last verdict known holds, as the control plane publishes nothing
// until its first probes decide. A prober fault (the checker probed and could not) is
// routable at once.
func (l *Loader) unhealthyLocked(s *pools.Service, key string, b *pools.Backend) bool {
	if s.HealthCheck == nil {
		delete(l.lastDown, key)
		return false
	}
	if l.external != nil {
		return l.externalDownLocked(s, key, b) // the control plane's verdict
	}
	if l.stoppingLocked() {
		// The checkers stop with the context: a stopped one reads Unknown, which says
		// nothing of the backend. A rebuild already under way keeps the last verdicts.
		return l.lastDown[key]
	}
	st := l.health.View(s.Name, b.Identity()) // Unknown before the first Apply has started the checker
	if st == health.Unknown && l.lastDown[key] && l.now().Before(l.holdUntil) {
		if tr, ok := l.seen[key]; !ok || tr.To != health.Unknown {
			return true
		}
	}
	l.lastDown[key] = !st.Routable()
	return l.lastDown[key]
}

// holdEndedLocked says, once, that the hold of unhealthyLocked has ended: the tables are
// built again, so a backend its checker could not probe (a first probe that hit a prober
// fault makes no transition) takes new flows.
func (l *Loader) holdEndedLocked(now time.Time) bool {
	if l.holdUntil.IsZero() || now.Before(l.holdUntil) {
		return false
	}
	l.holdUntil = time.Time{}
	return l.external == nil
}

// onTransition rebuilds the tables after a health transition (flows to surviving backends
// are untouched).
func (l *Loader) onTransition(service string, tr health.Transition) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.healthLog == nil {
		l.healthLog = healthlog.New(l.log)
	}
	l.healthLog.Transition(service, tr)
	if l.seen == nil {
		l.seen = map[string]health.Transition{}
	}
	l.seen[service+"/"+tr.ID] = tr
	if l.external != nil || l.file == nil {
		return // fed by a control plane: its verdicts, not this checker's, decide
	}
	if l.stoppingLocked() {
		return
	}
	if tr.Healthy && tr.From == health.Unhealthy {
		l.recoveredLocked(service+"/"+tr.ID, tr.At) // slow start ramps it up from then
	}
	l.rebuildLocked("a health transition")
}

// stoppingLocked says whether the context of the last Apply is done: the checkers are
// stopping, and one already stopped reads Unknown (routable), which a rebuild would write
// into the pinned backends that the next loader adopts as its last verdicts. A transition
// still in flight then changes nothing.
func (l *Loader) stoppingLocked() bool { return l.runCtx != nil && l.runCtx.Err() != nil }

// vipDigest sums up what an installed VIP makes the program do (its address, flags, timeouts
// and tables, and the weights weighted least connections reads from its members' slots),
// so that an identical re-install is told from a change.
func vipDigest(v VIP, ms []member, weights map[uint32]uint32) uint64 {
	h := fnv.New64a()
	var b [4]byte
	word := func(x uint32) {
		binary.LittleEndian.PutUint32(b[:], x)
		h.Write(b[:])
	}
	h.Write([]byte(v.Addr.String()))
	for _, x := range []uint32{v.ID, uint32(v.Proto), v.Flags, v.CIDLength, uint32(v.IdleTimeout / time.Second)} {
		word(x)
	}
	for _, t := range [][]uint32{v.Table, v.Schedule, v.Pool, v.Second} {
		word(uint32(len(t)))
		for _, x := range t {
			word(x)
		}
	}
	for _, m := range ms {
		word(m.slot)
		word(weights[m.slot])
	}
	return h.Sum64()
}
