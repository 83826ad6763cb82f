package main

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/stickylb/stickylb/l4xdp"
)

// What a command line that parses gives the loader: the flags' defaults, the insert cap's 0
// as "no cap", and the node id a --xds node gets when it names none.
func TestXDPFlagsConfig(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want xdpFlags
	}{
		{[]string{"--pools", "p.yaml", "--iface", "eth9"}, xdpFlags{pools: "p.yaml", poll: defaultPoll, cfg: l4xdp.Config{
			Iface: "eth9", Mode: l4xdp.ModeNative, PinRoot: l4xdp.DefaultPinRoot,
			Tables: l4xdp.Options{ConnTableSize: l4xdp.DefaultConnTableSize, InsertCap: l4xdp.DefaultInsertCap},
			NAT:    l4xdp.NAT{PortLow: l4xdp.DefaultNATPortLow, PortHigh: l4xdp.DefaultNATPortHigh}}}},
		{[]string{"--pools", "p.yaml", "--iface", "eth9", "--mode", "generic", "--zone", "z1", "--conn-insert-cap", "0",
			"--conn-table-size", "4096", "--metrics", ":9100", "--pin-root", "/x", "--poll", "5s", "--nat-ports", "2000-3000"},
			xdpFlags{pools: "p.yaml", poll: 5 * defaultPoll, metrics: httpAddr{addr: ":9100"}, node: xdsNode{zone: "z1"}, cfg: l4xdp.Config{
				Iface: "eth9", Mode: l4xdp.ModeGeneric, PinRoot: "/x", Zone: "z1",
				Tables: l4xdp.Options{ConnTableSize: 4096, InsertCap: -1},
				NAT:    l4xdp.NAT{PortLow: 2000, PortHigh: 3000}}}},
		{[]string{"--xds", "cp:18000", "--iface", "eth9"}, xdpFlags{poll: defaultPoll,
			node: xdsNode{server: "cp:18000", nodeID: defaultNodeID("eth9")}, cfg: l4xdp.Config{
				Iface: "eth9", Mode: l4xdp.ModeNative, PinRoot: l4xdp.DefaultPinRoot,
				Tables: l4xdp.Options{ConnTableSize: l4xdp.DefaultConnTableSize, InsertCap: l4xdp.DefaultInsertCap},
				NAT:    l4xdp.NAT{PortLow: l4xdp.DefaultNATPortLow, PortHigh: l4xdp.DefaultNATPortHigh}}}},
		{[]string{"stats", "--iface", "eth9", "--pin-root", "/x"}, xdpFlags{sub: "stats", poll: defaultPoll, cfg: l4xdp.Config{
			Iface: "eth9", Mode: l4xdp.ModeNative, PinRoot: "/x",
			Tables: l4xdp.Options{ConnTableSize: l4xdp.DefaultConnTableSize, InsertCap: l4xdp.DefaultInsertCap},
			NAT:    l4xdp.NAT{PortLow: l4xdp.DefaultNATPortLow, PortHigh: l4xdp.DefaultNATPortHigh}}}},
	} {
		var stderr bytes.Buffer
		got, err := parseXDPFlags(tc.args, &stderr)
		got.bgp = bgpFlags{} // off in these lines; bgpflags_test.go checks them
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%v: %v, stderr %q\n got %+v\nwant %+v", tc.args, err, stderr.String(), got, tc.want)
		}
	}
}
