package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"golang.org/x/sys/unix"
)

// BenchmarkSelectCPU: sticky_ip, sticky_header and weighted_least_conn against Caddy's
// client_ip_hash, header and least_conn at every size, as BenchmarkClientIP, BenchmarkHeader
// and BenchmarkLeastConn run them (provisioned in a reverse_proxy handler, fresh vars per
// request), but paired: each iteration runs a batch of 256 requests through one arm, then
// through the other (in turns, which goes first), each batch timed by the thread's own CPU
// clock. Time the thread waits for the CPU, which on a loaded machine swamps a wall-clock
// run, is not counted, and both arms see the same moments of the machine. Reports each
// arm's ns per Select (the per-request floor included) and stickylb's ratio to Caddy's.
// Run with -benchtime 400x or more.
func BenchmarkSelectCPU(b *testing.B) {
	header := plainRequests(func(i int, r *http.Request) { r.Header.Set("X-Session", fmt.Sprintf("session-%08d", i)) })
	pairs := []struct {
		name        string
		reqs        []benchReq
		ours, caddy benchArm
	}{
		{"ClientIP", plainRequests(nil),
			benchArm{name: "sticky_ip", cfg: func(*testing.B) any { return &StickyIP{} }},
			benchArm{name: "client_ip_hash", cfg: func(*testing.B) any { return reverseproxy.ClientIPHashSelection{} }}},
		{"Header", header,
			benchArm{name: "sticky_header", cfg: func(*testing.B) any {
				return &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{NoTable: true}}
			}},
			benchArm{name: "header", cfg: func(*testing.B) any { return &reverseproxy.HeaderHashSelection{Field: "X-Session"} }}},
		{"LeastConn", plainRequests(nil),
			benchArm{name: "weighted_least_conn", cfg: func(*testing.B) any { return &WeightedLeastConn{} }},
			benchArm{name: "least_conn", cfg: func(*testing.B) any { return reverseproxy.LeastConnSelection{} }}},
	}
	for _, p := range pairs {
		b.Run(p.name, func(b *testing.B) {
			benchPools(b, func(b *testing.B, src poolSource) {
				ours := inProxy(b, p.ours.name, p.ours.cfg(b), nil)
				caddy := inProxy(b, p.caddy.name, p.caddy.cfg(b), nil)
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				var to, tc time.Duration
				for i := 0; i < b.N; i++ {
					if i%2 == 0 {
						to += cpuBatch(b, ours, src, p.reqs)
						tc += cpuBatch(b, caddy, src, p.reqs)
					} else {
						tc += cpuBatch(b, caddy, src, p.reqs)
						to += cpuBatch(b, ours, src, p.reqs)
					}
				}
				n := float64(b.N) * cpuBatchSize
				b.ReportMetric(float64(to.Nanoseconds())/n, "stickylb-ns/op")
				b.ReportMetric(float64(tc.Nanoseconds())/n, "caddy-ns/op")
				b.ReportMetric(float64(to)/float64(tc), "ratio")
			})
		})
	}
}

const cpuBatchSize = 256

// cpuBatch times the thread's CPU time of one pass of reqs through sel, as runSelect runs them.
func cpuBatch(b *testing.B, sel reverseproxy.Selector, src poolSource, reqs []benchReq) time.Duration {
	w := httptest.NewRecorder()
	start := threadCPU(b)
	for i := range cpuBatchSize {
		q := &reqs[i]
		r := q.r.WithContext(context.WithValue(q.r.Context(), caddyhttp.VarsCtxKey, caddyVars(q.ip)))
		if sel.Select(src(i), r, w) == nil {
			b.Fatal("no upstream")
		}
	}
	return threadCPU(b) - start
}

func threadCPU(b *testing.B) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ts.Nano())
}
