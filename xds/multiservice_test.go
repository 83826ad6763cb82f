package xds

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/poolstest"
)

// TestGRPCClientBesideOtherServices: a grpc-go client subscribes to its own service's
// listener and cluster by name. In a file that also serves other services, go-control-plane's
// ADS-mode cache never answers a named request that leaves a resource of the snapshot out, so
// the client hung (DeadlineExceeded) as soon as a second service existed. gRPC and stickylb
// nodes are served by a cache that answers what they name; Envoy keeps the ordered ADS one.
func TestGRPCClientBesideOtherServices(t *testing.T) {
	bs := startGRPCBackends(t, 2)
	var b strings.Builder
	b.WriteString("services:\n")
	for _, name := range []string{"api", "other"} {
		fmt.Fprintf(&b, "  - name: %s\n    protocol: grpc\n    backends:\n", name)
		for _, be := range bs {
			fmt.Fprintf(&b, "      - {address: %q, zone: zone-a}\n", be.addr)
		}
	}
	b.WriteString("  - name: web\n    protocol: http\n    listen: 127.0.0.1:18299\n    backends: [{address: 127.0.0.1:18298}]\n")
	f := poolstest.Parse(t, b.String())
	_, addr := startXDS(t, f)
	cc := dialXDS(t, addr, "grpc-multi", "zone-a", "api")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := call(ctx, cc, "k"); err != nil {
		t.Fatalf("a call through xds:///api with other services in the file: %v", err)
	}
}
