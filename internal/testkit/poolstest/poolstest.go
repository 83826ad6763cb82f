// Package poolstest holds the pools files that the tests of several packages describe
// alike (the Caddy module's, the end-to-end ones, the control plane's) and parses them. A
// fixture written once keeps those tests agreeing on what the fleet is.
package poolstest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/policies/pools"
)

// The health check of API's service api: the tests bound how long a verdict takes to reach
// them with these.
const (
	Interval  = time.Second // the pools file's health_check interval (its minimum)
	Timeout   = 500 * time.Millisecond
	Unhealthy = 2
)

// API is the pools file of one HTTP service, api, health checked over HTTP at /health,
// with the given backend entries: each the inside of a flow mapping, such as
// "address: 127.0.0.1:8001, drain: true".
func API(entries ...string) string {
	var s strings.Builder
	fmt.Fprintf(&s, `services:
  - name: api
    protocol: http
    listen: 127.0.0.1:1
    health_check: {protocol: http, path: /health, interval: %s, timeout: %s, healthy_threshold: 1, unhealthy_threshold: %d}
    backends:
`, Interval, Timeout, Unhealthy)
	for _, e := range entries {
		fmt.Fprintf(&s, "      - {%s}\n", e)
	}
	return s.String()
}

// Addresses are API entries for backends at addrs, with nothing more.
func Addresses(addrs ...string) []string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = "address: " + a
	}
	return out
}

// CaddyFleet is a pools file of the services a Caddy node is sent and one it is spared:
// api (HTTP, not cross-zone, health checked, with backend api-1 of weight 3 in zone z1 and
// a draining one in z2), rpc (gRPC), and web (a TCP VIP: the XDP tier's, not Caddy's).
const CaddyFleet = `services:
  - name: api
    protocol: http
    listen: 0.0.0.0:8080
    cross_zone: false
    health_check: {protocol: http, path: /health}
    backends:
      - {address: 10.0.7.1:80, weight: 3, zone: z1, hash_key: api-1}
      - {address: 10.0.7.2:80, zone: z2, drain: true}
  - name: rpc
    protocol: grpc
    backends:
      - {address: 10.0.8.1:50051}
  - name: web
    protocol: tcp
    vip: 10.0.0.100:443
    balance: maglev
    backends:
      - {address: 10.0.6.1:443}
`

// Fleet is a pools file of one service per kind of node the control plane serves: api
// (HTTP, for Envoy and Caddy nodes: one backend in zone-a, a draining one in zone-b) and
// web (a TCP VIP for XDP nodes, source-IP affinity over Maglev: 10.0.6.1:443 with its MAC
// in zone-a, 10.0.6.2:443 of weight 2 in zone-b). Web comes last, so a test adds a backend
// to it by appending an entry.
const Fleet = `services:
  - name: api
    protocol: http
    listen: 127.0.0.1:18080
    backends:
      - {address: 10.0.7.1:80, zone: zone-a}
      - {address: 10.0.7.2:80, zone: zone-b, drain: true}
  - name: web
    protocol: tcp
    vip: 10.0.0.100:443
    affinity: {mode: source_ip}
    balance: maglev
    hash: {table_size: 251}
    backends:
      - {address: 10.0.6.1:443, mac: "02:00:00:00:06:01", zone: zone-a}
      - {address: 10.0.6.2:443, weight: 2, zone: zone-b}
`

// Parse parses text as a pools file named pools.yaml, failing tb if it is not one.
func Parse(tb testing.TB, text string) *pools.File {
	tb.Helper()
	f, err := pools.Parse("pools.yaml", []byte(text))
	if err != nil {
		tb.Fatalf("poolstest: %v", err)
	}
	return f
}
