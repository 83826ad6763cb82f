package fleetview

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

const file = `services:
  - name: web
    protocol: tcp
    vip: 10.0.0.100:443
    idle_timeout: 30s
    affinity: {mode: source_ip}
    balance: maglev
    hash: {table_size: 251}
    health_check: {protocol: tcp}
    drained_zones: [z3]
    cross_zone: false
    slow_start: {window: 1500ms, aggression: 1.5, min_weight_percent: 5}
    forwarding: dr
    backends:
      - {address: 10.0.6.1:443, mac: "02:00:00:00:06:01", zone: z1}
      - {address: 10.0.6.2:443, weight: 3, hash_key: b2, zone: z2}
      - {address: 10.0.6.3:443, drain: true}
      - {address: 10.0.6.4:443, zone: z3}
      - {address: 10.0.6.5:443, zone: z3, drain: true}
      - {address: 10.9.6.6:443, zone: z1, forwarding: nat}
  - name: wlc
    protocol: tcp
    vip: 10.0.0.101:25
    balance: weighted_least_conn
    slow_start: {window: 10s}
    backends:
      - {address: 10.0.6.1:25, zone: z1}
      - {address: 10.0.6.2:25, weight: 2, zone: z2}
      - {address: 10.9.6.3:2525, zone: z2}
      - {address: 10.0.6.4:25, forwarding: dr}
  - name: quic
    protocol: udp
    vip: 10.0.0.100:8443
    affinity: {mode: quic_cid, quic_cid: {cid_length: 10}}
    balance: maglev
    backends:
      - {address: 10.0.6.1:8443, server_id: 1}
      - {address: 10.0.6.2:8443, server_id: 2}
  - name: far
    protocol: tcp
    vip: 10.0.0.102:443
    forwarding: tunnel
    tunnel_port: 7000
    second_chance: false
    backends:
      - {address: 10.8.0.1:443}
      - {address: 10.8.0.2:443, drain: true}
  - name: api
    protocol: http
    listen: 0.0.0.0:8080
    backends:
      - {address: 10.0.7.1:80}
`

func byName(cs []*clusterv3.Cluster, ls []*endpointv3.ClusterLoadAssignment) (map[string]proto.Message, map[string]proto.Message) {
	c, l := map[string]proto.Message{}, map[string]proto.Message{}
	for _, x := range cs {
		c[x.GetName()] = x
	}
	for _, x := range ls {
		l[x.GetClusterName()] = x
	}
	return c, l
}

// TestRoundTrip: every field a forwarder uses survives encoding and decoding, in backend
// order, with the verdicts; services without a vip are not in the view; Envoy's validation
// passes on every resource.
func TestRoundTrip(t *testing.T) {
	f, err := pools.Parse("pools.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	since := time.Date(2026, 12, 3, 15, 4, 5, 123456789, time.UTC)
	cs, ls := Encode(f, func(svc string, b *pools.Backend) Verdict {
		switch b.Identity() {
		case "10.0.6.1:443":
			return Verdict{State: health.Unhealthy, Since: since}
		case "b2":
			return Verdict{State: health.Healthy, Since: since.Add(time.Second), From: health.Unhealthy}
		}
		return Verdict{}
	})
	if len(cs) != 4 || len(ls) != 4 {
		t.Fatalf("%d clusters and %d assignments, want 4 each (api has no vip)", len(cs), len(ls))
	}
	var all []proto.Message
	for i := range cs {
		all = append(all, cs[i], ls[i])
	}
	for _, m := range all {
		if err := m.(interface{ ValidateAll() error }).ValidateAll(); err != nil {
			t.Fatalf("Envoy's validation: %v", err)
		}
	}
	c, l := byName(cs, ls)
	v, err := Decode(c, l)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.File.Services) != 4 {
		t.Fatalf("%d services decoded", len(v.File.Services))
	}
	// The file holds every resolved forwarding, so the comparison below covers each.
	modes := map[pools.Forwarding]int{}
	for _, s := range f.Services {
		for _, b := range s.Backends {
			modes[s.ForwardingOf(b)]++
		}
	}
	if len(modes) != 4 {
		t.Fatalf("the file resolves forwarding to %v, want auto, dr, nat and tunnel", modes)
	}
	for _, got := range v.File.Services {
		want := f.Service(got.Name)
		if got.VIP != want.VIP || got.Protocol != want.Protocol || got.Affinity.Mode != want.Affinity.Mode ||
			got.Balance != want.Balance || got.Hash.TableSize != want.Hash.TableSize || got.IdleTimeout != want.IdleTimeout {
			t.Errorf("service %s: got %+v, want %+v", got.Name, got, want)
		}
		if got.CrossZone != want.CrossZone || !slices.Equal(got.DrainedZones, want.DrainedZones) {
			t.Errorf("service %s: cross_zone %v drained_zones %v, want %v %v", got.Name, got.CrossZone, got.DrainedZones, want.CrossZone, want.DrainedZones)
		}
		if got.Forwarding != want.Forwarding || got.TunnelPort != want.TunnelPort || got.SecondChance != want.SecondChance {
			t.Errorf("service %s: forwarding %q (tunnel_port %d, second_chance %v), want %q (%d, %v)", got.Name, got.Forwarding,
				got.TunnelPort, got.SecondChance, want.Forwarding, want.TunnelPort, want.SecondChance)
		}
		if (got.SlowStart == nil) != (want.SlowStart == nil) || got.SlowStart != nil && *got.SlowStart != *want.SlowStart {
			t.Errorf("service %s: slow_start %+v, want %+v", got.Name, got.SlowStart, want.SlowStart)
		}
		if (got.HealthCheck == nil) != (want.HealthCheck == nil) {
			t.Errorf("service %s: health checked %v, want %v", got.Name, got.HealthCheck != nil, want.HealthCheck != nil)
		}
		if (got.Affinity.QUICCID == nil) != (want.Affinity.QUICCID == nil) ||
			got.Affinity.QUICCID != nil && got.Affinity.QUICCID.CIDLength != want.Affinity.QUICCID.CIDLength {
			t.Errorf("service %s: quic_cid %+v, want %+v", got.Name, got.Affinity.QUICCID, want.Affinity.QUICCID)
		}
		if len(got.Backends) != len(want.Backends) {
			t.Fatalf("service %s: %d backends, want %d", got.Name, len(got.Backends), len(want.Backends))
		}
		for i, gb := range got.Backends {
			wb := want.Backends[i]
			// A drained zone's backend is not a draining one (the zone is the last resort)
			// unless it drains itself.
			if gb.Address != wb.Address || gb.Weight != wb.Weight || gb.Zone != wb.Zone || gb.HashKey != wb.HashKey ||
				gb.ServerID != wb.ServerID || gb.MAC != wb.MAC || gb.Drain != wb.Drain {
				t.Errorf("service %s backend %d: got %+v, want %+v", got.Name, i, gb, wb)
			}
			// The override itself, and so the mode the node resolves, as the file says.
			if gb.Forwarding != wb.Forwarding || got.ForwardingOf(gb) != want.ForwardingOf(wb) {
				t.Errorf("service %s backend %s: forwarding %q (resolved %q), want %q (%q)", got.Name, gb.Address,
					gb.Forwarding, got.ForwardingOf(gb), wb.Forwarding, want.ForwardingOf(wb))
			}
		}
	}
	if st := v.Verdicts[Key("web", "10.0.6.1:443")]; st.State != health.Unhealthy || !st.Since.Equal(since) {
		t.Errorf("web/10.0.6.1:443: %+v", st)
	}
	if st := v.Verdict("web", "b2"); st.State != health.Healthy || st.From != health.Unhealthy || !st.Since.Equal(since.Add(time.Second)) {
		t.Errorf("web/b2: %+v", st)
	}
	if st := v.Verdict("web", "10.0.6.3:443").State; st != health.Unknown {
		t.Errorf("web/10.0.6.3:443: %v", st)
	}
}

// TestDecodeRejects: what a forwarder cannot take is an error that says why; a cluster
// whose endpoints have not arrived is ErrIncomplete.
func TestDecodeRejects(t *testing.T) {
	f, err := pools.Parse("pools.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		edit       func(c *clusterv3.Cluster, l *endpointv3.ClusterLoadAssignment)
	}{
		{"unknown mode", `unknown affinity mode "consistent_magic"`, func(c *clusterv3.Cluster, _ *endpointv3.ClusterLoadAssignment) {
			c.Metadata.FilterMetadata[MetadataKey].Fields["affinity_mode"] = structpb.NewStringValue("consistent_magic")
		}},
		{"fractional size", "table_size: 2.5", func(c *clusterv3.Cluster, _ *endpointv3.ClusterLoadAssignment) {
			c.Metadata.FilterMetadata[MetadataKey].Fields["table_size"] = structpb.NewNumberValue(2.5)
		}},
		{"no metadata", "no metadata", func(c *clusterv3.Cluster, _ *endpointv3.ClusterLoadAssignment) { c.Metadata = nil }},
		{"bad mac", "not a 6-byte MAC", func(_ *clusterv3.Cluster, l *endpointv3.ClusterLoadAssignment) {
			l.Endpoints[0].LbEndpoints[0].Metadata.FilterMetadata[MetadataKey].Fields["mac"] = structpb.NewStringValue("zz")
		}},
		{"no window", "slow_start.window_seconds: want > 0", func(c *clusterv3.Cluster, _ *endpointv3.ClusterLoadAssignment) {
			c.Metadata.FilterMetadata[MetadataKey].Fields["slow_start"].GetStructValue().Fields["window_seconds"] = structpb.NewNumberValue(0)
		}},
		{"zones not a list", "drained_zones: not a list", func(c *clusterv3.Cluster, _ *endpointv3.ClusterLoadAssignment) {
			c.Metadata.FilterMetadata[MetadataKey].Fields["drained_zones"] = structpb.NewStringValue("z3")
		}},
		{"unknown balance", `balance "random"`, func(c *clusterv3.Cluster, _ *endpointv3.ClusterLoadAssignment) {
			c.Metadata.FilterMetadata[MetadataKey].Fields["balance"] = structpb.NewStringValue("random")
		}},
		{"round robin with a keyed affinity", "keyed affinity hashes with maglev", func(c *clusterv3.Cluster, _ *endpointv3.ClusterLoadAssignment) {
			c.Metadata.FilterMetadata[MetadataKey].Fields["balance"] = structpb.NewStringValue(pools.BalanceRoundRobin)
		}},
		{"bad health_from", `health_from "dizzy"`, func(_ *clusterv3.Cluster, l *endpointv3.ClusterLoadAssignment) {
			l.Endpoints[0].LbEndpoints[0].Metadata.FilterMetadata[MetadataKey].Fields["health_from"] = structpb.NewStringValue("dizzy")
		}},
		{"unknown forwarding", `forwarding "snat": want auto, dr, nat or tunnel`, func(c *clusterv3.Cluster, _ *endpointv3.ClusterLoadAssignment) {
			c.Metadata.FilterMetadata[MetadataKey].Fields["forwarding"] = structpb.NewStringValue("snat")
		}},
		{"forwarding not a string", "forwarding: not a string", func(c *clusterv3.Cluster, _ *endpointv3.ClusterLoadAssignment) {
			c.Metadata.FilterMetadata[MetadataKey].Fields["forwarding"] = structpb.NewBoolValue(true)
		}},
		{"unknown backend forwarding", `endpoint 0: forwarding "": want auto, dr, nat or tunnel`, func(_ *clusterv3.Cluster, l *endpointv3.ClusterLoadAssignment) {
			l.Endpoints[0].LbEndpoints[0].Metadata.FilterMetadata[MetadataKey].Fields["forwarding"] = structpb.NewStringValue("")
		}},
		{"weight over the pools file's", "weight 10001 out of range 1..10000", func(_ *clusterv3.Cluster, l *endpointv3.ClusterLoadAssignment) {
			l.Endpoints[0].LbEndpoints[0].LoadBalancingWeight = wrapperspb.UInt32(pools.MaxWeight + 1)
		}},
		{"bad health", `health "sick"`, func(_ *clusterv3.Cluster, l *endpointv3.ClusterLoadAssignment) {
			l.Endpoints[0].LbEndpoints[0].Metadata.FilterMetadata[MetadataKey].Fields["health"] = structpb.NewStringValue("sick")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, ls := Encode(f, nil)
			tc.edit(cs[0], ls[0])
			c, l := byName(cs, ls)
			_, err := Decode(c, l)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
	cs, ls := Encode(f, nil)
	c, l := byName(cs, ls)
	delete(l, "quic")
	if _, err := Decode(c, l); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("a cluster without endpoints: %v, want ErrIncomplete", err)
	}
}

// TestAssembler: nothing is applied until both halves are there (endpoints first do not
// empty the forwarder); a view Apply refuses is returned and the half last accepted stays.
func TestAssembler(t *testing.T) {
	f, err := pools.Parse("pools.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	var applied []*View
	refuse := false
	a := &Assembler{Apply: func(v *View) error {
		if refuse {
			return errors.New("refused")
		}
		applied = append(applied, v)
		return nil
	}}
	cs, ls := Encode(f, nil)
	c, l := byName(cs, ls)
	if err := a.Endpoints("1", l); err != nil || len(applied) != 0 {
		t.Fatalf("endpoints first: %v, %d applied", err, len(applied))
	}
	if err := a.Clusters("1", c); err != nil || len(applied) != 1 || len(applied[0].File.Services) != 4 {
		t.Fatalf("then clusters: %v, %d applied", err, len(applied))
	}
	refuse = true
	c2, _ := byName(Encode(f, nil))
	delete(c2, "quic")
	if err := a.Clusters("2", c2); err == nil {
		t.Fatal("a refused view was accepted")
	}
	refuse = false
	if err := a.Endpoints("3", l); err != nil || len(applied) != 2 || len(applied[1].File.Services) != 4 {
		t.Fatalf("after a refusal the last accepted clusters stay: %v, %d applied", err, len(applied))
	}
}

// TestDrainedZoneReaders: a reader that knows nothing of drained_zones (an older node)
// still sees a drained zone's backends as draining, in drain and in the health status; a
// view from a control plane that sends no drained_zones (an older one) decodes drain as
// given, and no cross_zone as on.
func TestDrainedZoneReaders(t *testing.T) {
	f, err := pools.Parse("pools.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	cs, ls := Encode(f, nil)
	z3 := ls[0].Endpoints[0].LbEndpoints[3]
	if md := z3.Metadata.FilterMetadata[MetadataKey].Fields; !md["drain"].GetBoolValue() || md["backend_drain"] != nil ||
		z3.GetHealthStatus().String() != "DRAINING" {
		t.Fatalf("a drained zone's backend: metadata %v, status %v", md, z3.GetHealthStatus())
	}
	delete(cs[0].Metadata.FilterMetadata[MetadataKey].Fields, "drained_zones")
	delete(cs[0].Metadata.FilterMetadata[MetadataKey].Fields, "cross_zone")
	c, l := byName(cs, ls)
	v, err := Decode(c, l)
	if err != nil {
		t.Fatal(err)
	}
	web := v.File.Service("web")
	if !web.Backends[3].Drain || !web.CrossZone || len(web.DrainedZones) != 0 {
		t.Fatalf("an older control plane's view: drain %v, cross_zone %v, drained_zones %v", web.Backends[3].Drain, web.CrossZone, web.DrainedZones)
	}
}

// TestForwardingReaders: a view from a control plane that sends no forwarding (an older
// one) decodes as auto, so a node forwards by DR where it can, as before.
func TestForwardingReaders(t *testing.T) {
	f, err := pools.Parse("pools.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	cs, ls := Encode(f, nil)
	delete(cs[0].Metadata.FilterMetadata[MetadataKey].Fields, "forwarding")
	for _, e := range ls[0].Endpoints[0].LbEndpoints {
		delete(e.Metadata.FilterMetadata[MetadataKey].Fields, "forwarding")
	}
	c, l := byName(cs, ls)
	v, err := Decode(c, l)
	if err != nil {
		t.Fatal(err)
	}
	web := v.File.Service("web")
	if web.Forwarding != pools.ForwardingAuto {
		t.Fatalf("no forwarding sent: %q, want auto", web.Forwarding)
	}
	for _, b := range web.Backends {
		if b.Forwarding != "" || web.ForwardingOf(b) != pools.ForwardingAuto {
			t.Errorf("backend %s: own %q, resolved %q; want none and auto", b.Address, b.Forwarding, web.ForwardingOf(b))
		}
	}
}
