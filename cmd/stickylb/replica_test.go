package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/stickylb/stickylb/internal/testkit/etcdtest"
	"github.com/stickylb/stickylb/internal/testkit/testcert"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

const apiPools = `# the fleet's pools file
services:
  - name: web
    protocol: http
    listen: 0.0.0.0:10000
    balance: weighted_least_conn
    backends:
      - {address: 10.0.1.1:8080, weight: 3, zone: zone-a} # the big one
      - address: 10.0.1.2:8080
        zone: zone-b
`

// bobToken is the API token of a second operator.
const bobToken = "b0b-s3cret-token-of-bob"

// apiRig is one replica with its change API over a one-member etcd.
type apiRig struct {
	t              *testing.T
	ep, api, admin string
	xds            string
	token          string
	dir            string
}

func newAPIRig(t *testing.T, tune ...func(*replicaFlags)) *apiRig {
	if testing.Short() {
		t.Skip("runs etcd: skipped under -short")
	}
	c := etcdtest.Start(t, 1, "127.0.0.1")
	rg := &apiRig{t: t, ep: c.Endpoints()[0], dir: t.TempDir(), token: "s3cret-token-of-alice"}
	p := filepath.Join(rg.dir, "pools.yaml")
	os.WriteFile(p, []byte(apiPools), 0o644)
	if code, _, errs := rg.run("pools", "apply", p, "--etcd", rg.ep); code != 0 {
		t.Fatal(errs)
	}
	tokens := filepath.Join(rg.dir, "tokens")
	os.WriteFile(tokens, []byte("# name token\nalice "+rg.token+"\nbob "+bobToken+"\n"), 0o600)
	os.WriteFile(filepath.Join(rg.dir, "bobtoken"), []byte(bobToken+"\n"), 0o600)
	os.WriteFile(filepath.Join(rg.dir, "token"), []byte(rg.token+"\n"), 0o600)
	var o xdsOptions
	o.listen, o.admin = "127.0.0.1:0", "127.0.0.1:0"
	o.replica = replicaFlags{store: storeFlags{etcd: rg.ep, prefix: "/stickylb"}, leaseTTL: 1, storeTimeout: 2 * time.Second,
		api: "127.0.0.1:0", apiTokens: tokens, id: "r1"}
	for _, f := range tune {
		f(&o.replica)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var stderr bytes.Buffer
		if code := serveReplica(ctx, o, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), &stderr, func(xdsAddr, admin, api string) {
			rg.xds, rg.admin, rg.api = xdsAddr, admin, api
			close(ready)
		}); code != 0 {
			t.Errorf("serveReplica: %d %s", code, stderr.String())
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	testwait.Recv(t, ready, 10*time.Second, "the replica listening")
	return rg
}

func (rg *apiRig) run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// ctl runs `stickylb ctl` against the rig's API with the token.
func (rg *apiRig) ctl(args ...string) (int, string, string) {
	return rg.run(append([]string{"ctl", "--api", "http://" + rg.api, "--token-file", filepath.Join(rg.dir, "token")}, args...)...)
}

func (rg *apiRig) stored() string {
	code, out, errs := rg.run("pools", "get", "--etcd", rg.ep)
	if code != 0 {
		rg.t.Fatal(errs)
	}
	return out
}

func (rg *apiRig) metrics() string {
	resp, err := http.Get("http://" + rg.admin + "/metrics")
	if err != nil {
		rg.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// The change API through `stickylb ctl`: drains, weights, adds and removes are edits of
// the stored file that keep its comments; a bad weight answers 400 naming the path and
// stores nothing; a request without credentials gets 401 and changes nothing; two PUTs
// of the file with the same If-Match give one 200 and one 409; every change is counted.
func TestChangeAPI(t *testing.T) {
	rg := newAPIRig(t)
	if code, _, errs := rg.ctl("drain", "web", "10.0.1.1:8080"); code != 0 {
		t.Fatalf("drain: %s", errs)
	}
	file := rg.stored()
	if !strings.Contains(file, "drain: true") || !strings.Contains(file, "# the big one") || !strings.Contains(file, "# the fleet's pools file") {
		t.Fatalf("after the drain:\n%s", file)
	}
	code, _, errs := rg.ctl("weight", "web", "10.0.1.1:8080", "20000")
	if code != 1 || !strings.Contains(errs, "services[web].backends[10.0.1.1:8080].weight: 20000 out of range 1..10000") || !strings.Contains(errs, "400") {
		t.Fatalf("a bad weight: %d %s", code, errs)
	}
	if code, _, errs := rg.ctl("weight", "web", "10.0.1.1:8080", "0"); code != 1 || !strings.Contains(errs, "services[web].backends[10.0.1.1:8080].weight: 0") {
		t.Fatalf("weight 0: %d %s", code, errs)
	}
	if rg.stored() != file {
		t.Fatal("a refused change was stored")
	}
	if code, _, errs := rg.ctl("weight", "web", "10.0.1.2:8080", "7"); code != 0 {
		t.Fatalf("weight: %s", errs)
	}
	// A mistyped backend: weight never adds it (404), add refuses one there already (409).
	if code, _, errs := rg.ctl("weight", "web", "10.0.1.7:8080", "5"); code != 1 || !strings.Contains(errs, "404") {
		t.Fatalf("weight of a backend the service lacks: %d %s", code, errs)
	}
	if strings.Contains(rg.stored(), "10.0.1.7") {
		t.Fatalf("weight added a backend:\n%s", rg.stored())
	}
	if code, _, errs := rg.ctl("add", "web", `{"address": "10.0.1.3:8080", "zone": "zone-b", "weight": 2}`); code != 0 {
		t.Fatalf("add: %s", errs)
	}
	if code, _, errs := rg.ctl("add", "web", `{"address": "10.0.1.3:8080", "weight": 4}`); code != 1 || !strings.Contains(errs, "409") {
		t.Fatalf("add of a backend there already: %d %s", code, errs)
	}
	if code, _, errs := rg.ctl("zone-drain", "web", "zone-b"); code != 0 {
		t.Fatalf("zone-drain: %s", errs)
	}
	if code, _, errs := rg.ctl("remove", "web", "10.0.1.1:8080"); code != 0 {
		t.Fatalf("remove: %s", errs)
	}
	if code, _, errs := rg.ctl("remove", "web", "10.0.9.9:1"); code != 1 || !strings.Contains(errs, "404") {
		t.Fatalf("remove of an unknown backend: %d %s", code, errs)
	}
	file = rg.stored()
	for _, want := range []string{"weight: 7", "10.0.1.3:8080", "drained_zones: [zone-b]"} {
		if !strings.Contains(file, want) {
			t.Fatalf("stored file lacks %q:\n%s", want, file)
		}
	}
	if strings.Contains(file, "10.0.1.1:8080") {
		t.Fatalf("the removed backend is still there:\n%s", file)
	}
	code, out, errs := rg.ctl("service", "web")
	if code != 0 || !strings.Contains(out, `"draining": true`) {
		t.Fatalf("service: %d %s %s", code, out, errs)
	}

	// No credentials, or a wrong token: 401, nothing stored.
	for _, auth := range []string{"", "Bearer not-the-token-at-all"} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+rg.api+"/v1/services/web/backends/10.0.1.2:8080/drain", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%q: %s, want 401", auth, resp.Status)
		}
	}
	if rg.stored() != file {
		t.Fatal("an unauthenticated request changed the file")
	}
	// A request for another name (a DNS rebinding's page) is refused before authentication.
	req, _ := http.NewRequest(http.MethodPost, "http://"+rg.api+"/v1/services/web/backends/10.0.1.2:8080/drain", nil)
	req.Host = "evil.example"
	req.Header.Set("Authorization", "Bearer "+rg.token)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("a request for Host evil.example: %v %v, want 421", resp, err)
	} else {
		resp.Body.Close()
	}
	if rg.stored() != file {
		t.Fatal("a request for another Host changed the file")
	}

	// Two PUTs with the same If-Match: one 200, one 409.
	req, _ = http.NewRequest(http.MethodGet, "http://"+rg.api+"/v1/pools", nil)
	req.Header.Set("Authorization", "Bearer "+rg.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	etag := resp.Header.Get("ETag")
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := strings.Replace(apiPools, "weight: 3", fmt.Sprintf("weight: %d", 4+i), 1)
			req, _ := http.NewRequest(http.MethodPut, "http://"+rg.api+"/v1/pools", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+rg.token)
			req.Header.Set("If-Match", etag)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	if !(codes[0] == 200 && codes[1] == 409 || codes[0] == 409 && codes[1] == 200) {
		t.Fatalf("two PUTs with If-Match %s: %v, want one 200 and one 409", etag, codes)
	}
	// ctl pools-put of another operator (bob) over alice's last change is refused, naming
	// her, unless --force; alice replacing her own change is not.
	put := filepath.Join(rg.dir, "put.yaml")
	os.WriteFile(put, []byte(apiPools), 0o644)
	bob := func(args ...string) (int, string, string) {
		return rg.run(append([]string{"ctl", "--api", "http://" + rg.api, "--token-file", filepath.Join(rg.dir, "bobtoken")}, args...)...)
	}
	if code, _, errs := bob("pools-put", put); code != 1 || !strings.Contains(errs, "token:alice") || !strings.Contains(errs, "--force") {
		t.Fatalf("bob's pools-put over alice's change: %d %s", code, errs)
	}
	if code, _, errs := bob("pools-put", put, "--force"); code != 0 {
		t.Fatalf("bob's pools-put --force: %s", errs)
	}
	if code, _, errs := bob("pools-put", put); code != 0 {
		t.Fatalf("bob's pools-put over his own: %s", errs)
	}
	// The replica's gRPC health service says it serves.
	cc, err := grpc.NewClient(rg.xds, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	testwait.For(t, 5*time.Second, "grpc.health.v1 SERVING", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING, fmt.Sprint(r, err)
	})
	m := rg.metrics()
	for _, want := range []string{`stickylb_xds_api_changes_total{op="backend_drain",result="ok"} 1`,
		`stickylb_xds_api_changes_total{op="backend_put",result="invalid"} 2`,
		`stickylb_xds_api_changes_total{op="backend_put",result="not_found"} 1`,
		`stickylb_xds_api_changes_total{op="backend_add",result="ok"} 1`,
		`stickylb_xds_api_changes_total{op="backend_add",result="conflict"} 1`,
		`stickylb_xds_api_changes_total{op="backend_drain",result="unauthorized"} 2`,
		`stickylb_xds_api_changes_total{op="pools_put",result="conflict"} 1`,
		"stickylb_xds_store_connected 1", "stickylb_xds_leader 1"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// --etcd with --pools is refused with the command that loads the file; an API on a
// non-loopback address needs TLS; the API needs credentials configured.
func TestReplicaFlagsRefused(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"xds", "--etcd", "http://127.0.0.1:1", "--pools", "p.yaml"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "stickylb pools apply") {
		t.Fatalf("--etcd with --pools: %d %s", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"xds", "--etcd", "http://127.0.0.1:1", "--store-timeout", "100ms"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "--store-timeout 100ms: at least 1s") {
		t.Fatalf("--store-timeout 100ms: %d %s", code, errb.String())
	}
	dir := t.TempDir()
	tokens, open := filepath.Join(dir, "tokens"), filepath.Join(dir, "open-tokens")
	os.WriteFile(tokens, []byte("alice s3cret-token-of-alice\n"), 0o600)
	os.WriteFile(open, []byte("alice s3cret-token-of-alice\n"), 0o644)
	os.Chmod(open, 0o644) // whatever the umask
	for _, rf := range []replicaFlags{{api: "0.0.0.0:9000", apiTokens: tokens}, {api: "127.0.0.1:9000"},
		{api: "127.0.0.1:9000", apiTokens: tokens, apiClientCA: "ca.pem"}, {api: "127.0.0.1:9000", apiTokens: tokens, apiNames: "ops"},
		{api: "127.0.0.1:9000", apiTokens: open}} {
		_, err := apiAuth(rf)
		if err == nil {
			_, err = apiListener(rf)
		}
		if err == nil {
			t.Errorf("%+v: accepted", rf)
		}
	}
	// ctl's token file: refused when others may read it, before any request.
	os.WriteFile(filepath.Join(dir, "token"), []byte("s3cret-token-of-alice\n"), 0o644)
	os.Chmod(filepath.Join(dir, "token"), 0o644)
	errb.Reset()
	if code := run([]string{"ctl", "--api", "http://127.0.0.1:1", "--token-file", filepath.Join(dir, "token"), "pools-get"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "chmod 600") {
		t.Fatalf("ctl with a token file others may read: %d %s", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"ctl", "--help"}, &out, &errb); code != 0 || strings.Count(errb.String(), "zone-drain") != 1 || !strings.Contains(errb.String(), "-timeout") {
		t.Fatalf("ctl --help: %d\n%s", code, errb.String())
	}
}

// The API over HTTPS with client certificates: a certificate the client CA signed
// authenticates (ctl --cert --key --ca); a client with neither a certificate nor a token
// gets 401; the audit names the certificate.
func TestChangeAPIClientCertificates(t *testing.T) {
	ca := testcert.NewCA(t, "api-ca")
	dir := t.TempDir()
	file := func(n string) string { return filepath.Join(dir, n) }
	ca.WriteCA(file("ca.pem"))
	ca.WriteLeaf(ca.Issue(testcert.Leaf{Name: "api", Server: true, IPs: []net.IP{net.ParseIP("127.0.0.1")}}), file("api.pem"), file("api.key"))
	ca.WriteLeaf(ca.Issue(testcert.Leaf{Name: "operator-1"}), file("op.pem"), file("op.key"))
	ca.WriteLeaf(ca.Issue(testcert.Leaf{Name: "node-1"}), file("node.pem"), file("node.key"))
	rg := newAPIRig(t, func(rf *replicaFlags) {
		rf.apiTokens, rf.apiCert, rf.apiKey, rf.apiClientCA = "", file("api.pem"), file("api.key"), file("ca.pem")
		rf.apiNames = "operator-1"
	})
	// A certificate the CA signed whose name is not on --api-client-names changes nothing.
	code, _, errs := rg.run("ctl", "--api", "https://"+rg.api, "--cert", file("node.pem"), "--key", file("node.key"), "--ca", file("ca.pem"),
		"drain", "web", "10.0.1.2:8080")
	if code != 1 || !strings.Contains(errs, "401") || strings.Contains(rg.stored(), "drain: true") {
		t.Fatalf("drain with a certificate not on the list: %d %s", code, errs)
	}
	code, _, errs = rg.run("ctl", "--api", "https://"+rg.api, "--cert", file("op.pem"), "--key", file("op.key"), "--ca", file("ca.pem"),
		"drain", "web", "10.0.1.2:8080")
	if code != 0 {
		t.Fatalf("drain with a client certificate: %s", errs)
	}
	if !strings.Contains(rg.stored(), "drain: true") {
		t.Fatal("the drain was not stored")
	}
	code, out, errs := rg.run("pools", "get", "--etcd", rg.ep)
	if code != 0 || !strings.Contains(errs, "cert:operator-1") {
		t.Fatalf("stored by: %q %q", errs, out)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}}
	resp, err := hc.Get("https://" + rg.api + "/v1/pools")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no certificate, no token: %s", resp.Status)
	}
}
