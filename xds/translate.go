// Package xds turns a pools file and a health view into Envoy resources (per node, from the
// node's locality) and serves them over ADS and the per-type xDS services with
// go-control-plane, to Envoy fleets and proxyless gRPC clients.
package xds

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	xdscorev3 "github.com/cncf/xds/go/xds/core/v3"
	matcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	statefulv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/stateful_session/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	udpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/udp/udp_proxy/v3"
	cookiestatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/stateful_session/cookie/v3"
	lbcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/common/v3"
	leastrequestv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	maglevv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/maglev/v3"
	ringhashv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/ring_hash/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	httptypev3 "github.com/envoyproxy/go-control-plane/envoy/type/http/v3"
	matcherenvoyv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/policies/zones"
)

// OverprovisioningFactor is pinned on every ClusterLoadAssignment: Envoy's default (1.4)
// spills a priority's load to the next one as soon as under 71% of its hosts are healthy,
// which would send a zone's traffic across zones with cross_zone off while it still has
// healthy hosts. 10000x keeps the load on a priority while any of its hosts is healthy.
const OverprovisioningFactor = 1_000_000

// EnvoyPanicThreshold is the healthy_panic_threshold (percent) pinned on every cluster.
// The control plane decides fail open itself (InPanic: every non-draining backend down ->
// all published UNKNOWN, which Envoy and gRPC route to), so Envoy's own panic is only a
// second guard, for when Envoy's own view (outlier ejections, a stale update) leaves it no
// available host: then it routes to every host rather than failing every request. Envoy reads
// the field as a whole percent (rounded), so 1 is the smallest value that is not "never
// panic"; with fewer than 100 hosts in a priority it panics only when none is available.
const EnvoyPanicThreshold = 1

// Node is what the translation needs of a subscribing node.
type Node struct {
	ID   string
	Zone string // locality zone; "" for a node outside every zone
	// Group is the node's snapshot group (GroupEnvoy, GroupXDP), from its user agent.
	Group string
}

// HealthView says what state the fleet-wide checker sees for a backend; nil or Unknown means
// no verdict yet (published as UNKNOWN, which Envoy and gRPC route to).
type HealthView func(service string, b *pools.Backend) health.State

// Resources is one node's snapshot content.
type Resources struct {
	Listeners []proto.Message
	Routes    []proto.Message
	Clusters  []proto.Message
	Endpoints []proto.Message
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("packing %T: %v", m, err)) // only registered message types are packed
	}
	return a
}

func typed(name string, m proto.Message) *corev3.TypedExtensionConfig {
	return &corev3.TypedExtensionConfig{Name: name, TypedConfig: mustAny(m)}
}

// Translate builds the resources a node sees for every http, grpc and tcp service of f.
func Translate(f *pools.File, node Node, view HealthView) (*Resources, error) {
	r := &Resources{}
	for _, s := range f.Services {
		if (s.Protocol == pools.ProtocolTCP || s.Protocol == pools.ProtocolUDP) && s.Listen == "" {
			continue // a VIP-only service: the XDP forwarder's
		}
		cla := loadAssignment(s, node, view)
		sized, err := ringSized(s, cla)
		if err != nil {
			return nil, fmt.Errorf("service %s: %w", s.Name, err)
		}
		c, err := cluster(sized)
		if err != nil {
			return nil, fmt.Errorf("service %s: %w", s.Name, err)
		}
		r.Clusters = append(r.Clusters, c)
		r.Endpoints = append(r.Endpoints, cla)
		switch s.Protocol {
		case pools.ProtocolHTTP, pools.ProtocolGRPC:
			r.Routes = append(r.Routes, routeConfig(s))
			l, err := httpListener(s)
			if err != nil {
				return nil, fmt.Errorf("service %s: %w", s.Name, err)
			}
			r.Listeners = append(r.Listeners, l)
		case pools.ProtocolUDP:
			l, err := udpListener(s)
			if err != nil {
				return nil, fmt.Errorf("service %s: %w", s.Name, err)
			}
			r.Listeners = append(r.Listeners, l)
		case pools.ProtocolTCP:
			l, err := tcpListener(s)
			if err != nil {
				return nil, fmt.Errorf("service %s: %w", s.Name, err)
			}
			r.Listeners = append(r.Listeners, l)
		}
	}
	return r, nil
}

func slowStart(ss *pools.SlowStart) *lbcommonv3.SlowStartConfig {
	if ss == nil || ss.Window == 0 {
		return nil
	}
	return &lbcommonv3.SlowStartConfig{
		SlowStartWindow:  durationpb.New(ss.Window),
		Aggression:       &corev3.RuntimeDouble{DefaultValue: ss.Aggression, RuntimeKey: "stickylb.slow_start.aggression"},
		MinWeightPercent: &typev3.Percent{Value: ss.MinWeightPercent},
	}
}

// lbPolicy is the typed load_balancing_policy list (never lb_policy: gRPC rejects MAGLEV):
// maglev falls back to the ring for clients without Maglev.
func lbPolicy(s *pools.Service) *clusterv3.LoadBalancingPolicy {
	ring := &ringhashv3.RingHash{
		HashFunction:    ringhashv3.RingHash_XX_HASH,
		MinimumRingSize: wrapperspb.UInt64(s.Hash.MinRingSize),
		MaximumRingSize: wrapperspb.UInt64(s.Hash.MaxRingSize),
	}
	if s.Hash.BoundedLoad > 0 {
		ring.HashBalanceFactor = wrapperspb.UInt32(s.Hash.BoundedLoad)
	}
	// Hosts are placed by their identity: with a hash_key anywhere, every endpoint carries
	// its identity as hostname and the hashes use it.
	byHostname := usesHashKeys(s)
	if byHostname {
		ring.ConsistentHashingLbConfig = &lbcommonv3.ConsistentHashingLbConfig{UseHostnameForHashing: true}
	}
	var ps []*clusterv3.LoadBalancingPolicy_Policy
	add := func(name string, m proto.Message) {
		ps = append(ps, &clusterv3.LoadBalancingPolicy_Policy{TypedExtensionConfig: typed(name, m)})
	}
	switch s.Balance {
	case pools.BalanceMaglev:
		m := &maglevv3.Maglev{TableSize: wrapperspb.UInt64(s.Hash.TableSize)}
		if s.Hash.BoundedLoad > 0 || byHostname {
			m.ConsistentHashingLbConfig = &lbcommonv3.ConsistentHashingLbConfig{UseHostnameForHashing: byHostname}
			if s.Hash.BoundedLoad > 0 {
				m.ConsistentHashingLbConfig.HashBalanceFactor = wrapperspb.UInt32(s.Hash.BoundedLoad)
			}
		}
		add("envoy.load_balancing_policies.maglev", m)
		add("envoy.load_balancing_policies.ring_hash", ring)
	case pools.BalanceRingHash:
		add("envoy.load_balancing_policies.ring_hash", ring)
	case pools.BalanceRoundRobin:
		add("envoy.load_balancing_policies.round_robin", &roundrobinv3.RoundRobin{SlowStartConfig: slowStart(s.SlowStart)})
	default:
		add("envoy.load_balancing_policies.least_request", &leastrequestv3.LeastRequest{SlowStartConfig: slowStart(s.SlowStart)})
	}
	return &clusterv3.LoadBalancingPolicy{Policies: ps}
}

func usesHashKeys(s *pools.Service) bool {
	return slices.ContainsFunc(s.Backends, func(b *pools.Backend) bool { return b.HashKey != "" })
}

// pinsSessions reports whether the service keeps sessions on a draining host (Envoy's
// stateful_session cookie does, through override_host_status).
func pinsSessions(s *pools.Service) bool {
	return s.Affinity.Mode == pools.ModeCookie || s.Affinity.Mode == pools.ModeAppCookie
}

func cluster(s *pools.Service) (*clusterv3.Cluster, error) {
	c := &clusterv3.Cluster{
		Name:                 s.Name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig: &corev3.ConfigSource{
				ResourceApiVersion:    corev3.ApiVersion_V3,
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			},
		},
		ConnectTimeout:      durationpb.New(5 * time.Second),
		LoadBalancingPolicy: lbPolicy(s),
		CommonLbConfig: &clusterv3.Cluster_CommonLbConfig{
			// Not Envoy's default 50%, which routes to hosts known to be down while half
			// of them are; see EnvoyPanicThreshold.
			HealthyPanicThreshold: &typev3.Percent{Value: EnvoyPanicThreshold},
		},
	}
	if pinsSessions(s) {
		// A pinned session stays on a DRAINING host (drain: true, drained zones).
		c.CommonLbConfig.OverrideHostStatus = &corev3.HealthStatusSet{Statuses: []corev3.HealthStatus{
			corev3.HealthStatus_UNKNOWN, corev3.HealthStatus_HEALTHY, corev3.HealthStatus_DRAINING,
		}}
	}
	if s.Protocol == pools.ProtocolGRPC {
		c.TypedExtensionProtocolOptions = nil // gRPC clients speak HTTP/2 to their backends natively
	}
	return c, nil
}

func socketAddress(addr string) (*corev3.Address, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("address %q: %w", addr, err)
	}
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       ap.Addr().String(),
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(ap.Port())},
	}}}, nil
}

// InPanic reports whether no backend of s that may take new sessions is healthy (and there
// is at least one): the control plane then fails open (zones.Eligible's FailOpen),
// publishing the down ones as UNKNOWN so that every tier keeps routing to them rather than
// to nothing. Draining backends stay out of new sessions either way; a drained zone's
// healthy backend keeps a service out of panic (it is the last resort). A backend not yet
// probed, or that the prober cannot probe, is Unknown and routable, so it keeps a service
// out of panic too.
func InPanic(s *pools.Service, view HealthView) bool {
	if view == nil {
		return false
	}
	bs, _ := zoneBackends(s, view)
	return zones.Eligible("", bs, zonePolicy(s)).FailOpen
}

// zoneBackends is s's backends as the zone rule sees them, with the view's verdict of each
// by identity (Unknown without a view).
func zoneBackends(s *pools.Service, view HealthView) ([]zones.Backend, map[string]health.State) {
	bs := make([]zones.Backend, 0, len(s.Backends))
	states := make(map[string]health.State, len(s.Backends))
	for _, b := range s.Backends {
		st := health.Unknown
		if view != nil {
			st = view(s.Name, b)
		}
		states[b.Identity()] = st
		bs = append(bs, zones.Backend{ID: b.Identity(), Zone: b.Zone, Weight: float64(b.Weight), Healthy: st != health.Unhealthy, Drain: b.Drain})
	}
	return bs, states
}

func zonePolicy(s *pools.Service) zones.Policy {
	return zones.Policy{CrossZone: s.CrossZone, DrainedZones: s.DrainedZones}
}

// loadAssignment is the service's endpoints as node sees them: one locality per zone and
// priority, or per priority for hash services (onePerPriority).
func loadAssignment(s *pools.Service, node Node, view HealthView) *endpointv3.ClusterLoadAssignment {
	return assignment(s, node, view, hashes(s))
}

// assignment publishes the zone rule (zones.Localities: a client that takes the lowest
// priority with a healthy endpoint sends new sessions where zones.Eligible says) with each
// endpoint's health: UNHEALTHY when down, UNKNOWN for every backend the service fails open
// to, DRAINING for those that take no new sessions.
func assignment(s *pools.Service, node Node, view HealthView, merge bool) *endpointv3.ClusterLoadAssignment {
	bs, states := zoneBackends(s, view)
	p := zonePolicy(s)
	panicking := zones.Eligible("", bs, p).FailOpen
	byID := make(map[string]*pools.Backend, len(s.Backends))
	for _, b := range s.Backends {
		byID[b.Identity()] = b
	}
	cla := &endpointv3.ClusterLoadAssignment{
		ClusterName: s.Name,
		Policy:      &endpointv3.ClusterLoadAssignment_Policy{OverprovisioningFactor: wrapperspb.UInt32(OverprovisioningFactor)},
	}
	ls := zones.Localities(node.Zone, bs, p)
	if merge {
		ls = onePerPriority(ls)
	}
	for _, l := range ls {
		le := &endpointv3.LocalityLbEndpoints{
			Locality:            &corev3.Locality{Zone: l.Zone},
			Priority:            l.Priority,
			LoadBalancingWeight: wrapperspb.UInt32(uint32(l.Weight)),
		}
		for _, e := range l.Endpoints {
			b := byID[e.ID]
			addr, _ := socketAddress(b.Address) // validated by the pools parser
			status := corev3.HealthStatus_UNKNOWN
			switch states[e.ID] {
			case health.Healthy:
				status = corev3.HealthStatus_HEALTHY
			case health.Unhealthy:
				if !panicking || e.Draining {
					status = corev3.HealthStatus_UNHEALTHY
				}
			}
			if e.Draining && status != corev3.HealthStatus_UNHEALTHY {
				status = corev3.HealthStatus_DRAINING
			}
			ep := &endpointv3.Endpoint{Address: addr}
			if usesHashKeys(s) {
				ep.Hostname = b.Identity()
			}
			le.LbEndpoints = append(le.LbEndpoints, &endpointv3.LbEndpoint{
				HostIdentifier:      &endpointv3.LbEndpoint_Endpoint{Endpoint: ep},
				HealthStatus:        status,
				LoadBalancingWeight: wrapperspb.UInt32(b.Weight),
			})
		}
		cla.Endpoints = append(cla.Endpoints, le)
	}
	return cla
}

// hashes reports whether s places keys on a hash table (ring_hash, maglev and its ring
// fallback), where every tier must weigh hosts alike.
func hashes(s *pools.Service) bool {
	return s.Balance == pools.BalanceRingHash || s.Balance == pools.BalanceMaglev
}

// onePerPriority merges the zones of each priority into one locality, for hash services.
//
// Envoy builds a priority's ring or Maglev table from its endpoints' weights alone (locality
// weights count only with locality_weighted_lb_config, which we never set), as Caddy and
// XDP do. grpc-go multiplies them with the locality weights: L x w with
// GRPC_EXPERIMENTAL_PF_WEIGHTED_SHUFFLING=false, fixed-point w/S x L/sum(L) by default (S
// the locality's endpoint weights, unhealthy ones included, rounded twice). With a single
// locality the locality factor is common to every endpoint, so both grpc-go modes are
// proportional to w as Envoy is, and the default rounds once. Endpoints are sorted by
// identity over the whole priority: Envoy walks them in EDS order, and the order decides
// which host gets a ring's fractional leftovers. The locality keeps its zone when the
// priority has one, else it is named after its zones joined by '+' (no zone name has one),
// so no two priorities share a locality.
func onePerPriority(ls []zones.Locality) []zones.Locality {
	var out []zones.Locality
	for _, l := range ls { // ordered by priority
		n := len(out)
		if n == 0 || out[n-1].Priority != l.Priority {
			l.Endpoints = slices.Clone(l.Endpoints)
			out = append(out, l)
			continue
		}
		m := &out[n-1]
		m.Zone += "+" + l.Zone
		m.Weight += l.Weight
		m.Endpoints = append(m.Endpoints, l.Endpoints...)
	}
	for i := range out {
		slices.SortFunc(out[i].Endpoints, func(a, b zones.Endpoint) int { return strings.Compare(a.ID, b.ID) })
	}
	return out
}

// hashPolicies maps the service's affinity to route hash policies (keyed modes).
func hashPolicies(s *pools.Service) []*routev3.RouteAction_HashPolicy {
	a := s.Affinity
	switch a.Mode {
	case pools.ModeHeader:
		return []*routev3.RouteAction_HashPolicy{{PolicySpecifier: &routev3.RouteAction_HashPolicy_Header_{
			Header: &routev3.RouteAction_HashPolicy_Header{HeaderName: a.Header.Name}}}}
	case pools.ModeSourceIP:
		return []*routev3.RouteAction_HashPolicy{{PolicySpecifier: &routev3.RouteAction_HashPolicy_ConnectionProperties_{
			ConnectionProperties: &routev3.RouteAction_HashPolicy_ConnectionProperties{SourceIp: true}}}}
	case pools.ModeURL:
		if a.URL.Source == pools.URLQuery {
			return []*routev3.RouteAction_HashPolicy{{PolicySpecifier: &routev3.RouteAction_HashPolicy_QueryParameter_{
				QueryParameter: &routev3.RouteAction_HashPolicy_QueryParameter{Name: a.URL.Query}}}}
		}
		// Path segments and suffixes hash the :path header rewritten to the key, so Envoy
		// hashes the same bytes as Caddy's sticky_url.
		return []*routev3.RouteAction_HashPolicy{{PolicySpecifier: &routev3.RouteAction_HashPolicy_Header_{
			Header: &routev3.RouteAction_HashPolicy_Header{HeaderName: ":path", RegexRewrite: pathRewrite(a.URL)}}}}
	}
	return nil
}

func routeConfig(s *pools.Service) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{
		Name: s.Name,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    s.Name,
			Domains: []string{"*"},
			Routes: []*routev3.Route{{
				Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{
					ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: s.Name},
					HashPolicy:       hashPolicies(s),
				}},
			}},
		}},
	}
}

// httpFilters: stateful_session for cookie modes (optional: gRPC may not know it), then the
// router, last as Envoy requires.
func httpFilters(s *pools.Service) []*hcmv3.HttpFilter {
	var fs []*hcmv3.HttpFilter
	if pinsSessions(s) {
		name := pools.DefaultCookieName
		path := "/"
		if s.Affinity.Mode == pools.ModeCookie {
			name, path = s.Affinity.Cookie.Name, s.Affinity.Cookie.Path
		} else {
			// Envoy cannot prefix the application's cookie; it pins the issuing host with its
			// own cookie, named after the application's.
			name = "stickylb_" + s.Affinity.AppCookie.Name
		}
		fs = append(fs, &hcmv3.HttpFilter{
			Name: "envoy.filters.http.stateful_session",
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&statefulv3.StatefulSession{
				SessionState: typed("envoy.http.stateful_session.cookie", &cookiestatev3.CookieBasedSessionState{
					Cookie: &httptypev3.Cookie{Name: name, Path: path, Ttl: durationpb.New(s.Affinity.TTL)},
				}),
			})},
			IsOptional: true,
		})
	}
	return append(fs, &hcmv3.HttpFilter{
		Name:       "envoy.filters.http.router",
		ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
	})
}

func hcm(s *pools.Service) *hcmv3.HttpConnectionManager {
	return &hcmv3.HttpConnectionManager{
		StatPrefix: s.Name,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			RouteConfigName: s.Name,
			ConfigSource: &corev3.ConfigSource{
				ResourceApiVersion:    corev3.ApiVersion_V3,
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			},
		}},
		HttpFilters: httpFilters(s),
	}
}

// httpListener: a socket listener for Envoy when the service has listen, and for grpc an
// api_listener named after the service, which proxyless clients resolve for xds:///NAME.
func httpListener(s *pools.Service) (*listenerv3.Listener, error) {
	if s.Protocol == pools.ProtocolGRPC && s.Listen == "" {
		return &listenerv3.Listener{
			Name:        s.Name,
			ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(hcm(s))},
		}, nil
	}
	addr, err := socketAddress(s.Listen)
	if err != nil {
		return nil, err
	}
	l := &listenerv3.Listener{
		Name:    s.Name,
		Address: addr,
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name:       "envoy.filters.network.http_connection_manager",
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(hcm(s))},
		}}}},
	}
	if s.Protocol == pools.ProtocolGRPC {
		l.ApiListener = &listenerv3.ApiListener{ApiListener: mustAny(hcm(s))}
	}
	return l, nil
}

func tcpListener(s *pools.Service) (*listenerv3.Listener, error) {
	addr, err := socketAddress(s.Listen)
	if err != nil {
		return nil, err
	}
	tp := &tcpproxyv3.TcpProxy{
		StatPrefix:       s.Name,
		ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: s.Name},
	}
	if s.Affinity.Mode == pools.ModeSourceIP {
		tp.HashPolicy = []*typev3.HashPolicy{{PolicySpecifier: &typev3.HashPolicy_SourceIp_{SourceIp: &typev3.HashPolicy_SourceIp{}}}}
	}
	return &listenerv3.Listener{
		Name:    s.Name,
		Address: addr,
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name:       "envoy.filters.network.tcp_proxy",
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(tp)},
		}}}},
	}, nil
}

// udpListener: a UDP listener whose udp_proxy routes every datagram to the cluster (through
// the matcher: the plain cluster field is deprecated), hashing the source IP for source_ip
// affinity.
func udpListener(s *pools.Service) (*listenerv3.Listener, error) {
	addr, err := socketAddress(s.Listen)
	if err != nil {
		return nil, err
	}
	addr.GetSocketAddress().Protocol = corev3.SocketAddress_UDP
	up := &udpproxyv3.UdpProxyConfig{
		StatPrefix: s.Name,
		RouteSpecifier: &udpproxyv3.UdpProxyConfig_Matcher{Matcher: &matcherv3.Matcher{
			OnNoMatch: &matcherv3.Matcher_OnMatch{OnMatch: &matcherv3.Matcher_OnMatch_Action{
				Action: &xdscorev3.TypedExtensionConfig{Name: "route", TypedConfig: mustAny(&udpproxyv3.Route{Cluster: s.Name})},
			}},
		}},
	}
	if s.Affinity.Mode == pools.ModeSourceIP || s.Affinity.Mode == pools.ModeQUICCID {
		up.HashPolicies = []*udpproxyv3.UdpProxyConfig_HashPolicy{{PolicySpecifier: &udpproxyv3.UdpProxyConfig_HashPolicy_SourceIp{SourceIp: true}}}
	}
	return &listenerv3.Listener{
		Name:    s.Name,
		Address: addr,
		ListenerFilters: []*listenerv3.ListenerFilter{{
			Name:       "envoy.filters.udp_listener.udp_proxy",
			ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(up)},
		}},
	}, nil
}

// pathRewrite is the RE2 rewrite of :path to the URL key: segment N (0-based; negative from
// the end) or the value after a suffix marker, up to the next ';', '/' or '?'.
func pathRewrite(u *pools.URLKey) *matcherenvoyv3.RegexMatchAndSubstitute {
	var re string
	switch {
	case u.Source == pools.URLSuffix:
		re = `^[^?]*?` + regexp.QuoteMeta(u.Suffix) + `([^;/?]*).*$`
	case u.PathSegment >= 0:
		re = fmt.Sprintf(`^/(?:[^/?]*/){%d}([^/?]*)(?:[/?].*)?$`, u.PathSegment)
	default:
		re = fmt.Sprintf(`^[^?]*?/([^/?]*)(?:/[^/?]*){%d}(?:\?.*)?$`, -u.PathSegment-1)
	}
	return &matcherenvoyv3.RegexMatchAndSubstitute{
		Pattern:      &matcherenvoyv3.RegexMatcher{Regex: re},
		Substitution: `\1`,
	}
}
