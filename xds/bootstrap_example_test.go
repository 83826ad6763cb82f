package xds

import (
	"encoding/json"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// The Envoy bootstrap of examples/ is a valid Bootstrap by Envoy's own rules (ValidateAll,
// the Any it holds included), and lists the three replicas with a gRPC health check.
func TestEnvoyBootstrapExample(t *testing.T) {
	raw, err := os.ReadFile("../examples/envoy/bootstrap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatal(err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	c := b.GetStaticResources().GetClusters()[0]
	if n := len(c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()); n != 3 || c.GetHealthChecks()[0].GetGrpcHealthCheck() == nil {
		t.Fatalf("the stickylb_xds cluster: %d endpoints, health checks %v", n, c.GetHealthChecks())
	}
}
