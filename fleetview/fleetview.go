// Package fleetview is the view of the fleet that `stickylb xds` serves to stickylb's own
// nodes, and the one codec both ends use: XDP forwarders (`stickylb xdp --xds`; Encode and
// Decode: every service with a vip) and Caddy nodes (the `stickylb_xds` upstream source;
// EncodeCaddy and DecodeCaddy: every http and grpc service). Either view is one Envoy
// Cluster per service and one ClusterLoadAssignment per such service, the fields Envoy has
// no place for carried in metadata.filter_metadata["stickylb"]. The control plane and the
// nodes import this package, so the encoding has one definition. With adsclient it is the
// contract layer between the xds adapter and the node tiers (l4xdp's command, caddymodule):
// it imports the Envoy API types, protobuf and policies only, never an adapter.
//
// What a node accepts is decided here too, once for both tiers: a view is held to the
// pools file's limits as it is decoded (names, zones, hash keys, weights; over them it is
// NACKed), an Assembler applies what is complete while a cluster waits for its endpoints,
// and an Admission leaves out the endpoints a node must not dial (admit.go).
//
// Envoy types are used, not a type of the project's own, so that go-control-plane's
// snapshot cache serves them (it refuses unknown type URLs) and Envoy's validation rules
// check them; separate snapshot groups (one for XDP nodes, one for Caddy nodes) keep them
// from Envoy and gRPC nodes.
package fleetview

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// MetadataKey is the filter_metadata key of the XDP-only fields.
const MetadataKey = "stickylb"

// UserAgentXDP is the node.user_agent_name of `stickylb xdp --xds` nodes: the control plane
// serves them this view instead of the Envoy resources.
const UserAgentXDP = "stickylb-xdp"

// Verdict is the control plane's health verdict on one backend of one service.
type Verdict struct {
	State health.State
	// Since is when the backend entered State (zero when unknown).
	Since time.Time
	// From is the state the backend left at Since (Unknown when not said): a healthy
	// verdict from unhealthy is a recovery, which a forwarder ramps with slow start from
	// Since even if it never saw the backend down (it connected after), so every node
	// ramps alike.
	From health.State
}

// View is what an XDP node applies: the services with a vip (only the fields the
// forwarder uses are set; HealthCheck is non-nil but empty for a service the control plane
// checks, so a node tells "not probed yet" from "not checked") and the control plane's
// verdicts.
type View struct {
	File *pools.File
	// Verdicts are keyed by Key(service, identity); a backend not listed is Unknown.
	Verdicts map[string]Verdict
	// Waiting are the services whose cluster arrived without its endpoints, by name. Decode
	// leaves them out of File; an Assembler puts back the last good state of those that had
	// one (Kept) and says since when each waits.
	Waiting []Waiting
}

// Waiting is a service whose endpoints have not arrived.
type Waiting struct {
	Service string
	// Since is when the node first saw the cluster without its endpoints (zero from Decode).
	Since time.Time
	// Kept: the node serves the service's last good state; else it serves nothing of it.
	Kept bool
}

// Key is the Verdicts key of a backend of a service.
func Key(service, identity string) string { return service + "/" + identity }

// Verdict is the control plane's verdict on the backend with identity id of service
// (the zero Verdict, Unknown, when there is none).
func (v *View) Verdict(service, id string) Verdict { return v.Verdicts[Key(service, id)] }

// Encode builds the view of f's services with a vip, in file order of backends (Maglev
// tables are built in that order), with verdict's health. verdict may be nil (Unknown).
func Encode(f *pools.File, verdict func(service string, b *pools.Backend) Verdict) ([]*clusterv3.Cluster, []*endpointv3.ClusterLoadAssignment) {
	var cs []*clusterv3.Cluster
	var ls []*endpointv3.ClusterLoadAssignment
	for _, s := range f.Services {
		if s.VIP == "" {
			continue
		}
		cs = append(cs, encodeCluster(s))
		ls = append(ls, encodeEndpoints(s, verdict))
	}
	return cs, ls
}

func meta(fields map[string]*structpb.Value) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataKey: {Fields: fields}}}
}

func encodeCluster(s *pools.Service) *clusterv3.Cluster {
	f := serviceFields(s)
	f["vip"] = structpb.NewStringValue(s.VIP)
	f["affinity_mode"] = structpb.NewStringValue(s.Affinity.Mode)
	f["balance"] = structpb.NewStringValue(s.Balance)
	f["table_size"] = structpb.NewNumberValue(float64(s.Hash.TableSize))
	f["idle_timeout_seconds"] = structpb.NewNumberValue(s.IdleTimeout.Seconds())
	if s.Forwarding != "" {
		f["forwarding"] = structpb.NewStringValue(string(s.Forwarding))
	}
	if s.Forwarding == pools.ForwardingTunnel {
		f["tunnel_port"] = structpb.NewNumberValue(float64(s.TunnelPort))
		f["second_chance"] = structpb.NewBoolValue(s.SecondChance)
	}
	if s.Affinity.QUICCID != nil {
		f["cid_length"] = structpb.NewNumberValue(float64(s.Affinity.QUICCID.CIDLength))
	}
	if ss := s.SlowStart; ss != nil {
		f["slow_start"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"window_seconds":     structpb.NewNumberValue(ss.Window.Seconds()),
			"aggression":         structpb.NewNumberValue(ss.Aggression),
			"min_weight_percent": structpb.NewNumberValue(ss.MinWeightPercent),
		}})
	}
	c := edsCluster(s.Name, f)
	c.LbPolicy = clusterv3.Cluster_MAGLEV
	return c
}

// edsCluster is a view's cluster: named after its service, its endpoints over ADS, and
// the stickylb fields in its metadata (the rest only satisfies Envoy's validation).
func edsCluster(name string, fields map[string]*structpb.Value) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
			ResourceApiVersion:    corev3.ApiVersion_V3,
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		}},
		ConnectTimeout: durationpb.New(5 * time.Second),
		Metadata:       meta(fields),
	}
}

// serviceFields are the metadata fields of every view's cluster: the protocol, whether the
// control plane checks the backends, and the zones. A node keeps to its own zone with
// cross_zone false; drained zones are listed (not only folded into each endpoint's drain)
// because a drained zone is the last resort, which a plain drain is not.
func serviceFields(s *pools.Service) map[string]*structpb.Value {
	f := map[string]*structpb.Value{
		"protocol":       structpb.NewStringValue(s.Protocol),
		"health_checked": structpb.NewBoolValue(s.HealthCheck != nil),
		"cross_zone":     structpb.NewBoolValue(s.CrossZone),
	}
	if len(s.DrainedZones) > 0 {
		zs := make([]*structpb.Value, len(s.DrainedZones))
		for i, z := range s.DrainedZones {
			zs[i] = structpb.NewStringValue(z)
		}
		f["drained_zones"] = structpb.NewListValue(&structpb.ListValue{Values: zs})
	}
	return f
}

// service reads what serviceFields wrote, into a new service named name.
func (f *fields) service(name string) *pools.Service {
	s := &pools.Service{Name: name, Protocol: f.str("protocol", true),
		CrossZone:    f.boolOr("cross_zone", true), // the pools file's default
		DrainedZones: f.strings("drained_zones")}
	if f.boolean("health_checked") {
		s.HealthCheck = &pools.HealthCheck{}
	}
	for i, z := range s.DrainedZones {
		if !pools.ValidZone(z) {
			f.fail("drained_zones[%d] %q: want %s", i, z, zoneRule)
		}
	}
	return s
}

// The pools file's rules for the names a view carries, as its errors say them.
var (
	zoneRule    = fmt.Sprintf("letters, digits, '.', '_' and '-', at most %d of them", pools.MaxZoneLength)
	hashKeyRule = fmt.Sprintf("1..%d printable characters without spaces", pools.MaxHashKeyLength)
)

func encodeEndpoints(s *pools.Service, verdict func(string, *pools.Backend) Verdict) *endpointv3.ClusterLoadAssignment {
	le := &endpointv3.LocalityLbEndpoints{}
	for _, b := range s.Backends {
		var v Verdict
		if verdict != nil {
			v = verdict(s.Name, b)
		}
		drain := b.Drain || s.ZoneDrained(b.Zone)
		status := corev3.HealthStatus_UNKNOWN
		switch {
		case v.State == health.Unhealthy:
			status = corev3.HealthStatus_UNHEALTHY
		case drain:
			status = corev3.HealthStatus_DRAINING
		case v.State == health.Healthy:
			status = corev3.HealthStatus_HEALTHY
		}
		// drain folds in the drained zones, so a reader that knows nothing of zones still
		// sends no new flow there; backend_drain is the backend's own, which a reader of
		// drained_zones needs to keep a drained zone as the last resort.
		f := map[string]*structpb.Value{
			"address": structpb.NewStringValue(b.Address),
			"drain":   structpb.NewBoolValue(drain),
			"health":  structpb.NewStringValue(v.State.String()),
		}
		if b.Drain {
			f["backend_drain"] = structpb.NewBoolValue(true)
		}
		if !v.Since.IsZero() {
			f["health_since"] = structpb.NewStringValue(v.Since.UTC().Format(time.RFC3339Nano))
		}
		if v.From != health.Unknown {
			f["health_from"] = structpb.NewStringValue(v.From.String())
		}
		for k, val := range map[string]string{"mac": b.MAC, "hash_key": b.HashKey, "zone": b.Zone} {
			if val != "" {
				f[k] = structpb.NewStringValue(val)
			}
		}
		if b.ServerID != 0 {
			f["server_id"] = structpb.NewNumberValue(float64(b.ServerID))
		}
		// The backend's own, not ForwardingOf's: the node resolves it with the service's
		// as the pools file says, so an override stays one.
		if b.Forwarding != "" {
			f["forwarding"] = structpb.NewStringValue(string(b.Forwarding))
		}
		ap := b.AddrPort()
		le.LbEndpoints = append(le.LbEndpoints, &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address:       ap.Addr().String(),
					PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(ap.Port())},
				}}},
			}},
			HealthStatus:        status,
			LoadBalancingWeight: wrapperspb.UInt32(b.Weight),
			Metadata:            meta(f),
		})
	}
	return &endpointv3.ClusterLoadAssignment{ClusterName: s.Name, Endpoints: []*endpointv3.LocalityLbEndpoints{le}}
}

// ErrIncomplete says a cluster's ClusterLoadAssignment has not arrived yet (CDS and EDS
// come as separate responses, and a broken control plane may never send one).
var ErrIncomplete = errors.New("fleetview: a cluster's endpoints have not arrived")

// Decode reads the view from clusters and load assignments by name (as an ADS client hands
// them over). A load assignment without a cluster is ignored. Clusters without one give
// ErrIncomplete together with the view of the others, which names them in Waiting. Anything
// a forwarder cannot take (an unknown affinity mode, a balance other than maglev, a
// malformed field, a name or a number the pools file could not hold) is an error naming
// the resource and the field, and no view.
func Decode(clusters, assignments map[string]proto.Message) (*View, error) {
	return decodeView(clusters, assignments, decodeCluster)
}

// decodeView reads a view: each cluster, in name order, as a service by readCluster (the
// XDP or the Caddy reading), then their load assignments. Clusters come first, so a bad
// one is reported even while another waits for its endpoints.
func decodeView(clusters, assignments map[string]proto.Message, readCluster func(*clusterv3.Cluster) (*pools.Service, error)) (*View, error) {
	v := &View{File: &pools.File{Filename: "xds"}, Verdicts: map[string]Verdict{}}
	for _, name := range slices.Sorted(maps.Keys(clusters)) {
		if !pools.ValidName(name) {
			return nil, fmt.Errorf("cluster %s: not a service name of a pools file (lowercase letters, digits and '-', at most %d)", clip(name), pools.MaxNameLength)
		}
		c, ok := clusters[name].(*clusterv3.Cluster)
		if !ok {
			return nil, fmt.Errorf("cluster %s: a %T, not a Cluster", name, clusters[name])
		}
		if c.GetName() != name {
			return nil, fmt.Errorf("cluster %s: named %s inside", name, clip(c.GetName()))
		}
		s, err := readCluster(c)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: %w", name, err)
		}
		v.File.Services = append(v.File.Services, s)
	}
	if err := v.attachEndpoints(assignments); err != nil {
		return nil, err
	}
	if len(v.Waiting) > 0 {
		names := make([]string, len(v.Waiting))
		for i, w := range v.Waiting {
			names[i] = w.Service
		}
		return v, fmt.Errorf("clusters %v: %w", names, ErrIncomplete)
	}
	return v, nil
}

// attachEndpoints decodes the load assignment of each of v's services; the services
// without one leave File for Waiting.
func (v *View) attachEndpoints(assignments map[string]proto.Message) error {
	complete := v.File.Services[:0:0]
	for _, s := range v.File.Services {
		m, ok := assignments[s.Name]
		if !ok {
			v.Waiting = append(v.Waiting, Waiting{Service: s.Name})
			continue
		}
		cla, ok := m.(*endpointv3.ClusterLoadAssignment)
		if !ok {
			return fmt.Errorf("endpoints %s: a %T, not a ClusterLoadAssignment", s.Name, m)
		}
		if err := decodeEndpoints(s, cla, v.Verdicts); err != nil {
			return fmt.Errorf("endpoints %s: %w", s.Name, err)
		}
		complete = append(complete, s)
	}
	v.File.Services = complete
	return nil
}

// fields reads a metadata struct as typed getters that remember the first error.
type fields struct {
	m   map[string]*structpb.Value
	err error
}

func fieldsOf(md *corev3.Metadata) (*fields, error) {
	st := md.GetFilterMetadata()[MetadataKey]
	if st == nil {
		return nil, fmt.Errorf("no metadata.filter_metadata[%q]", MetadataKey)
	}
	return &fields{m: st.GetFields()}, nil
}

func (f *fields) fail(format string, args ...any) {
	if f.err == nil {
		f.err = fmt.Errorf(format, args...)
	}
}

func (f *fields) str(key string, required bool) string {
	v, ok := f.m[key]
	if !ok {
		if required {
			f.fail("%s: missing", key)
		}
		return ""
	}
	s, ok := v.GetKind().(*structpb.Value_StringValue)
	if !ok {
		f.fail("%s: not a string", key)
		return ""
	}
	return f.bounded(key, s.StringValue)
}

// maxString bounds every string of a view's metadata: none is longer than the longest a
// pools file holds (a hash_key), so a hostile view costs no more than a real one where it
// is kept, logged or saved.
const maxString = pools.MaxHashKeyLength

// bounded returns v, or "" and an error when it is longer than maxString.
func (f *fields) bounded(key, v string) string {
	if len(v) > maxString {
		f.fail("%s: %d bytes, over the %d a view's string may hold", key, len(v), maxString)
		return ""
	}
	return v
}

// name reads an optional string held to valid (a pools-file rule); what names the rule in
// the error.
func (f *fields) name(key string, valid func(string) bool, what string) string {
	v := f.str(key, false)
	if v != "" && !valid(v) {
		f.fail("%s %q: want %s", key, v, what)
		return ""
	}
	return v
}

// clip quotes s for an error, at most 64 bytes of it: an untrusted name stays short.
func clip(s string) string {
	if len(s) <= 64 {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:64], len(s))
}

// uint reads a whole number in [0, max].
func (f *fields) uint(key string, required bool, max uint64) uint64 {
	v, ok := f.m[key]
	if !ok {
		if required {
			f.fail("%s: missing", key)
		}
		return 0
	}
	n, ok := v.GetKind().(*structpb.Value_NumberValue)
	if !ok || n.NumberValue < 0 || n.NumberValue != math.Trunc(n.NumberValue) || n.NumberValue > float64(max) {
		f.fail("%s: %v is not a whole number in 0..%d", key, v.AsInterface(), max)
		return 0
	}
	return uint64(n.NumberValue)
}

func (f *fields) boolean(key string) bool {
	v, ok := f.m[key]
	if !ok {
		return false
	}
	b, ok := v.GetKind().(*structpb.Value_BoolValue)
	if !ok {
		f.fail("%s: not a boolean", key)
		return false
	}
	return b.BoolValue
}

// number reads a finite number >= 0 (0 when absent).
func (f *fields) number(key string) float64 {
	v, ok := f.m[key]
	if !ok {
		return 0
	}
	n, ok := v.GetKind().(*structpb.Value_NumberValue)
	if !ok || math.IsNaN(n.NumberValue) || math.IsInf(n.NumberValue, 0) || n.NumberValue < 0 {
		f.fail("%s: %v is not a number >= 0", key, v.AsInterface())
		return 0
	}
	return n.NumberValue
}

// boolOr reads a boolean, def when absent (a control plane older than the field).
func (f *fields) boolOr(key string, def bool) bool {
	if _, ok := f.m[key]; !ok {
		return def
	}
	return f.boolean(key)
}

// strings reads a list of strings.
func (f *fields) strings(key string) []string {
	v, ok := f.m[key]
	if !ok {
		return nil
	}
	l, ok := v.GetKind().(*structpb.Value_ListValue)
	if !ok {
		f.fail("%s: not a list", key)
		return nil
	}
	var out []string
	for i, e := range l.ListValue.GetValues() {
		s, ok := e.GetKind().(*structpb.Value_StringValue)
		if !ok {
			f.fail("%s[%d]: not a string", key, i)
			return nil
		}
		out = append(out, f.bounded(fmt.Sprintf("%s[%d]", key, i), s.StringValue))
	}
	return out
}

// sub reads a nested struct (nil when absent).
func (f *fields) sub(key string) *fields {
	v, ok := f.m[key]
	if !ok {
		return nil
	}
	st, ok := v.GetKind().(*structpb.Value_StructValue)
	if !ok {
		f.fail("%s: not a struct", key)
		return nil
	}
	return &fields{m: st.StructValue.GetFields()}
}

// forwarding reads a forwarding mode (auto when absent).
func (f *fields) forwarding() pools.Forwarding {
	if _, ok := f.m["forwarding"]; !ok {
		return pools.ForwardingAuto
	}
	v := pools.Forwarding(f.str("forwarding", true))
	if f.err == nil && !v.Known() {
		f.fail("forwarding %q: want auto, dr, nat or tunnel", v)
		return ""
	}
	return v
}

// slowStart reads the slow_start struct: the window, the aggression and the floor, as the
// pools file's slow_start (the formula is policies/balance's on every tier).
func (f *fields) slowStart() *pools.SlowStart {
	sf := f.sub("slow_start")
	if sf == nil {
		return nil
	}
	ss := &pools.SlowStart{Window: time.Duration(sf.number("window_seconds") * float64(time.Second)),
		Aggression: sf.number("aggression"), MinWeightPercent: sf.number("min_weight_percent")}
	switch {
	case sf.err != nil:
		f.fail("slow_start.%w", sf.err)
	case ss.Window <= 0:
		f.fail("slow_start.window_seconds: want > 0")
	case ss.Aggression <= 0:
		f.fail("slow_start.aggression: want > 0")
	case ss.MinWeightPercent > 100:
		f.fail("slow_start.min_weight_percent: %v is over 100", ss.MinWeightPercent)
	}
	return ss
}

// xdpBalances are the balance algorithms a forwarder implements.
var xdpBalances = []string{pools.BalanceMaglev, pools.BalanceRoundRobin, pools.BalanceLeastConn}

// xdpModes are the affinity modes a forwarder implements (the 5-tuple for none).
var xdpModes = []string{pools.ModeNone, pools.ModeSourceIP, pools.ModeQUICCID}

func decodeCluster(c *clusterv3.Cluster) (*pools.Service, error) {
	f, err := fieldsOf(c.GetMetadata())
	if err != nil {
		return nil, err
	}
	s := f.service(c.GetName())
	s.VIP, s.Affinity.Mode, s.Balance = f.str("vip", true), f.str("affinity_mode", true), f.str("balance", true)
	// Absent: a control plane older than the field, whose nodes forwarded by DR where they
	// could, which auto still does.
	s.Forwarding = f.forwarding()
	if s.Forwarding == pools.ForwardingTunnel {
		s.TunnelPort = uint16(f.uint("tunnel_port", true, math.MaxUint16))
		s.SecondChance = f.boolean("second_chance")
	}
	// Table sizes are checked against the forwarder's maps by the loader; here only that
	// the number is one.
	s.Hash.TableSize = f.uint("table_size", true, math.MaxUint32)
	s.IdleTimeout = time.Duration(f.uint("idle_timeout_seconds", false, math.MaxUint32)) * time.Second
	cid := f.uint("cid_length", false, pools.MaxCIDLength)
	s.SlowStart = f.slowStart()
	if f.err != nil {
		return nil, f.err
	}
	if _, err := netip.ParseAddrPort(s.VIP); err != nil {
		return nil, fmt.Errorf("vip %q: %w", s.VIP, err)
	}
	if s.Protocol != pools.ProtocolTCP && s.Protocol != pools.ProtocolUDP {
		return nil, fmt.Errorf("protocol %q: want tcp or udp", s.Protocol)
	}
	if !slices.Contains(xdpModes, s.Affinity.Mode) {
		return nil, fmt.Errorf("unknown affinity mode %q for a forwarder (want one of %v)", s.Affinity.Mode, xdpModes)
	}
	if !slices.Contains(xdpBalances, s.Balance) {
		return nil, fmt.Errorf("balance %q: a forwarder implements %v", s.Balance, xdpBalances)
	}
	if s.Affinity.Mode != pools.ModeNone && s.Balance != pools.BalanceMaglev {
		return nil, fmt.Errorf("balance %q with affinity %s: a keyed affinity hashes with maglev", s.Balance, s.Affinity.Mode)
	}
	if s.Hash.TableSize == 0 {
		return nil, errors.New("table_size 0")
	}
	if s.Forwarding == pools.ForwardingTunnel && s.TunnelPort == 0 {
		return nil, errors.New("tunnel_port 0")
	}
	if s.Affinity.Mode == pools.ModeQUICCID {
		if cid < pools.MinCIDLength {
			return nil, fmt.Errorf("cid_length %d: want %d..%d", cid, pools.MinCIDLength, pools.MaxCIDLength)
		}
		s.Affinity.QUICCID = &pools.QUICCID{CIDLength: int(cid)}
	}
	return s, nil
}

func decodeEndpoints(s *pools.Service, cla *endpointv3.ClusterLoadAssignment, verdicts map[string]Verdict) error {
	seen := map[string]bool{}
	for _, le := range cla.GetEndpoints() {
		for i, e := range le.GetLbEndpoints() {
			f, err := fieldsOf(e.GetMetadata())
			if err != nil {
				return fmt.Errorf("endpoint %d: %w", i, err)
			}
			b := &pools.Backend{Address: f.str("address", false), MAC: f.str("mac", false),
				HashKey: f.name("hash_key", pools.ValidHashKey, hashKeyRule), Zone: f.name("zone", pools.ValidZone, zoneRule),
				Drain: f.boolean("drain"), Weight: e.GetLoadBalancingWeight().GetValue()}
			if s.ZoneDrained(b.Zone) {
				// Drained by its zone, the last resort, unless the backend drains itself.
				b.Drain = f.boolean("backend_drain")
			}
			b.ServerID = uint16(f.uint("server_id", false, math.MaxUint16))
			if _, ok := f.m["forwarding"]; ok {
				b.Forwarding = f.forwarding()
			}
			state, since, from := f.str("health", false), f.str("health_since", false), f.str("health_from", false)
			if f.err != nil {
				return fmt.Errorf("endpoint %d: %w", i, f.err)
			}
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			if b.Address == "" {
				a, err := netip.ParseAddr(sa.GetAddress())
				if err != nil {
					return fmt.Errorf("endpoint %d: address %s: not an IP address", i, clip(sa.GetAddress()))
				}
				b.Address = netip.AddrPortFrom(a, uint16(sa.GetPortValue())).String()
			}
			if _, err := netip.ParseAddrPort(b.Address); err != nil {
				return fmt.Errorf("endpoint %d: address %q: %w", i, b.Address, err)
			}
			if b.MAC != "" {
				if hw, err := net.ParseMAC(b.MAC); err != nil || len(hw) != 6 {
					return fmt.Errorf("endpoint %s: mac %q is not a 6-byte MAC", b.Address, b.MAC)
				}
			}
			// The pools file's bounds: a weight the file could not hold is refused, not
			// wrapped by a tier's arithmetic (the forwarder scales weights by 100).
			switch {
			case b.Weight == 0:
				b.Weight = pools.DefaultWeight
			case b.Weight > pools.MaxWeight:
				return fmt.Errorf("endpoint %s: weight %d out of range 1..%d", b.Address, b.Weight, pools.MaxWeight)
			}
			if seen[b.Identity()] {
				return fmt.Errorf("endpoint %d: backend %s listed twice", i, b.Identity())
			}
			seen[b.Identity()] = true
			v := Verdict{}
			if v.State, err = parseState(state); err != nil {
				return fmt.Errorf("endpoint %s: health %w", b.Address, err)
			}
			if v.From, err = parseState(from); err != nil {
				return fmt.Errorf("endpoint %s: health_from %w", b.Address, err)
			}
			if since != "" {
				t, err := time.Parse(time.RFC3339Nano, since)
				if err != nil {
					return fmt.Errorf("endpoint %s: health_since: %w", b.Address, err)
				}
				v.Since = t
			}
			if v.State != health.Unknown || !v.Since.IsZero() || v.From != health.Unknown {
				verdicts[Key(s.Name, b.Identity())] = v
			}
			s.Backends = append(s.Backends, b)
		}
	}
	return nil
}

// parseState reads a verdict's state ("" is Unknown).
func parseState(s string) (health.State, error) {
	switch s {
	case "", health.Unknown.String():
		return health.Unknown, nil
	case health.Healthy.String():
		return health.Healthy, nil
	case health.Unhealthy.String():
		return health.Unhealthy, nil
	}
	return health.Unknown, fmt.Errorf("%q: want healthy, unhealthy or unknown", s)
}
