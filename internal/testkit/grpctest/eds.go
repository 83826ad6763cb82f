package grpctest

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// EndpointStatuses is what a node reads from an EDS response: the health status of every
// endpoint of the ClusterLoadAssignment that is resp's first resource, by name(endpoint).
func EndpointStatuses(tb testing.TB, resp *discoveryv3.DiscoveryResponse, name func(*endpointv3.LbEndpoint) string) map[string]corev3.HealthStatus {
	tb.Helper()
	if len(resp.GetResources()) == 0 {
		tb.Fatalf("grpctest: an EDS response (version %q) without resources", resp.GetVersionInfo())
	}
	var cla endpointv3.ClusterLoadAssignment
	if err := resp.GetResources()[0].UnmarshalTo(&cla); err != nil {
		tb.Fatalf("grpctest: the EDS response's first resource: %v", err)
	}
	out := map[string]corev3.HealthStatus{}
	for _, le := range cla.GetEndpoints() {
		for _, e := range le.GetLbEndpoints() {
			out[name(e)] = e.GetHealthStatus()
		}
	}
	return out
}
