package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/stickylb/stickylb/policies/chash"
)

func TestAdaptVirtualNodes(t *testing.T) {
	for policy, want := range map[string]string{
		"sticky_header X-Session {\n hash ring\n virtual_nodes 160\n no_table\n}": `{"policy":"sticky_header","name":"X-Session","hash":"ring","virtual_nodes":160,"no_table":true}`,
		"sticky_ip {\n virtual_nodes 200\n hash ring\n}":                          `{"policy":"sticky_ip","hash":"ring","virtual_nodes":200}`,
		"sticky_url {\n query sid\n hash ring\n virtual_nodes 150\n}":             `{"policy":"sticky_url","query":"sid","hash":"ring","virtual_nodes":150}`,
	} {
		got, err := adapt(t, policy)
		if err != nil {
			t.Fatal(err)
		}
		var w map[string]any
		if err := json.Unmarshal([]byte(want), &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, w) {
			g, _ := json.Marshal(got)
			t.Errorf("got  %s\nwant %s", g, want)
		}
	}
	if _, err := adapt(t, "sticky_ip {\n virtual_nodes many\n}"); err == nil || !strings.Contains(err.Error(), "Caddyfile:") {
		t.Fatalf("bad virtual_nodes: %v", err)
	}
}

func TestVirtualNodesProvisionErrors(t *testing.T) {
	for _, o := range []KeyedOptions{
		{VirtualNodes: 160},                                    // Maglev by default
		{Hash: hashMaglev, VirtualNodes: 160},                  // Maglev named
		{Hash: hashRing, VirtualNodes: 160, MinRingSize: 1024}, // exclusive
		{Hash: hashRing, VirtualNodes: 160, MaxRingSize: 4096},
		{Hash: hashRing, VirtualNodes: chash.MaxRingSize + 1},
	} {
		s := &StickyHeader{Name: "X-Session", KeyedOptions: o}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := s.Provision(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "virtual_nodes") {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// TestVirtualNodesSelect: sticky_header with virtual_nodes picks what chash's virtual-node
// ring over the eligible upstreams picks, and adding a fourth upstream moves keys only to it.
func TestVirtualNodesSelect(t *testing.T) {
	pick := func(pool reverseproxy.UpstreamPool, keys int) []string {
		s := &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{Hash: hashRing, VirtualNodes: 160, NoTable: true}}
		provision(t, s)
		var got []string
		for i := range keys {
			r := request("/")
			r.Header.Set("X-Session", fmt.Sprintf("s-%d", i))
			u := s.Select(pool, r, httptest.NewRecorder())
			if u == nil {
				t.Fatal("no upstream")
			}
			got = append(got, u.Dial)
		}
		return got
	}
	const keys = 20_000
	p3, p4 := testPool(3), testPool(4)
	a, b := pick(p3, keys), pick(p4, keys)
	hosts := make([]chash.Host, 4)
	for i, u := range p4 {
		hosts[i] = chash.Host{ID: u.Dial, Weight: 1}
	}
	ring, err := chash.NewVirtualNodesRing(hosts, 160, 1)
	if err != nil {
		t.Fatal(err)
	}
	moved := 0
	for i := range keys {
		if want := hosts[ring.Pick(chash.KeyHash(fmt.Sprintf("s-%d", i)))].ID; b[i] != want {
			t.Fatalf("key %d: sticky_header picked %s, the virtual-node ring %s", i, b[i], want)
		}
		if a[i] != b[i] {
			moved++
			if b[i] != p4[3].Dial {
				t.Fatalf("key %d moved from %s to %s, an old upstream", i, a[i], b[i])
			}
		}
	}
	t.Logf("3 -> 4 upstreams: %.4f of %d keys moved (ideal 0.25), all to the new one", float64(moved)/keys, keys)
	if ring.Size() != 640 {
		t.Fatalf("ring of %d points, want 640", ring.Size())
	}
}
