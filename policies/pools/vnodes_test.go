package pools

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func vnodesFile(protocol, balance, hash string, weights ...int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "services:\n  - name: api\n    protocol: %s\n    affinity: {mode: header, header: {name: x-k}}\n    balance: %s\n    hash: %s\n    backends:\n", protocol, balance, hash)
	for i, w := range weights {
		fmt.Fprintf(&b, "      - {address: 10.0.0.%d:80, weight: %d}\n", i+1, w)
	}
	return b.String()
}

func TestValidateVirtualNodes(t *testing.T) {
	f, err := Parse("v.yaml", []byte(vnodesFile("grpc", "ring_hash", "{virtual_nodes: 160}", 3, 1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	s := f.Services[0]
	if s.Hash.VirtualNodes != 160 || s.MinWeight() != 1 || len(f.Warnings) != 0 {
		t.Fatalf("hash %+v min weight %d warnings %v", s.Hash, s.MinWeight(), f.Warnings)
	}
	// 160 x 36 / 1 = 5760 points: Envoy and Caddy build it, gRPC caps it at 4096.
	f, err = Parse("v.yaml", []byte(vnodesFile("grpc", "ring_hash", "{virtual_nodes: 160}", 10, 10, 10, 5, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Warnings) != 1 || !strings.HasPrefix(f.Warnings[0].Error(), "v.yaml:6:") || !strings.Contains(f.Warnings[0].Msg, "5760 points") || !strings.Contains(f.Warnings[0].Msg, "gRPC caps rings at 4096") {
		t.Fatalf("warnings: %v", f.Warnings)
	}
	// The same ring on an http service has no gRPC clients to warn about.
	if f, err = Parse("v.yaml", []byte(vnodesFile("http", "ring_hash", "{virtual_nodes: 160}", 10, 10, 10, 5, 1))); err != nil || len(f.Warnings) != 0 {
		t.Fatalf("http: %v %v", err, f.Warnings)
	}
}

func TestValidateVirtualNodesErrors(t *testing.T) {
	for _, c := range []struct {
		src  string
		want []string // substrings, each with its file:line:col
	}{
		{vnodesFile("http", "ring_hash", "{virtual_nodes: 160, min_ring_size: 1024}", 1, 1),
			[]string{"v.yaml:6:32: hash min_ring_size and virtual_nodes (line 6) are exclusive"}},
		{vnodesFile("http", "ring_hash", "{max_ring_size: 8192,\n           virtual_nodes: 160}", 1, 1),
			[]string{"v.yaml:6:12: hash max_ring_size and virtual_nodes (line 7) are exclusive"}},
		{vnodesFile("http", "maglev", "{virtual_nodes: 160}", 1, 1),
			[]string{"v.yaml:6:12: hash virtual_nodes applies to balance ring_hash, not maglev"}},
		{vnodesFile("http", "ring_hash", "{virtual_nodes: 0}", 1, 1),
			[]string{"v.yaml:6:27: virtual_nodes 0 out of range"}},
		{vnodesFile("http", "ring_hash", "{virtual_nodes: many}", 1, 1),
			[]string{"v.yaml:6:27: virtual_nodes: want an integer"}},
		{vnodesFile("http", "ring_hash", "{virtual_nodes: 1000}", 1, 10000),
			[]string{"v.yaml:6:27: virtual_nodes 1000: 1000 x total weight 10001 / smallest weight 1 is more than Envoy's largest ring"}},
	} {
		_, err := Parse("v.yaml", []byte(c.src))
		var list ErrorList
		if !errors.As(err, &list) {
			t.Fatalf("%s: %v", c.src, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("want %q in:\n%v", w, err)
			}
		}
		if len(list) != len(c.want) {
			t.Errorf("%d errors, want %d:\n%v", len(list), len(c.want), err)
		}
	}
}
