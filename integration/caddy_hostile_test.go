package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/adstest"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// procKB reads a "Name:   N kB" line of /proc/PID/status.
func procKB(t *testing.T, pid int, name string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name+":"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", name, pid)
	return 0
}

// A hostile control plane sends a Caddy node a view with a 100 MB zone string. The node
// reads no more than max_message_size of a response (16 MiB by default): the stream ends
// unread, its memory stays where it was, and its view file keeps the last good view.
func TestCaddyXDSHugeView(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Caddy against a control plane sending 100 MB views: about 10 s")
	}
	cp := adstest.Start(t)
	cs, ls := fleetview.EncodeCaddy(poolstest.Parse(t, poolstest.CaddyFleet), nil)
	v1 := cp.Set(t, cs, ls)
	dir := t.TempDir()
	caddyfile := filepath.Join(dir, "Caddyfile")
	writeAtomic(t, caddyfile, cxCaddyfile(freePort(t), cp.Addr, "huge/caddy", "", ""))
	data := filepath.Join(dir, "data")
	caddy := runCaddy(t, caddyfile, "XDG_DATA_HOME="+data)
	testwait.For(t, 30*time.Second, "Caddy's ACK of the first view", func() (bool, string) {
		return cp.Acked(resource.EndpointType) == v1, fmt.Sprintf("acked %q", cp.Acked(resource.EndpointType))
	})
	files, _ := filepath.Glob(filepath.Join(data, "caddy", "stickylb", "xds", "view-*.json"))
	if len(files) != 1 {
		t.Fatalf("view files %v, want one", files)
	}
	pid := caddy.Process.Pid
	before := procKB(t, pid, "VmRSS")
	// Reset the peak (VmHWM) to the resident set now: what follows is the view's cost.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
	huge := proto.Clone(ls[0]).(*endpointv3.ClusterLoadAssignment)
	huge.Endpoints[0].LbEndpoints[0].Metadata.FilterMetadata[fleetview.MetadataKey].Fields["zone"] = structpb.NewStringValue(strings.Repeat("z", 100<<20))
	opens := cp.Opens()
	v2 := cp.Set(t, cs, append([]*endpointv3.ClusterLoadAssignment{huge}, ls[1:]...))
	// Taken (ACKed), refused (NACKed), or not read: the stream ended and Caddy dialled again
	// (twice, so the second read of it failed as well).
	took := testwait.For(t, 60*time.Second, "Caddy's answer to the 100 MB view", func() (bool, string) {
		return cp.Acked(resource.EndpointType) == v2 || len(cp.NACKs()) > 0 || cp.Opens() >= opens+2,
			fmt.Sprintf("acked %q, %d NACKs, %d streams", cp.Acked(resource.EndpointType), len(cp.NACKs()), cp.Opens()-opens)
	})
	peak := procKB(t, pid, "VmHWM")
	st, err := os.Stat(files[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after %s: RSS %d MB before, peak %d MB; acked %q, %d NACKs, %d new streams; view file %d bytes",
		took.Round(time.Millisecond), before>>10, peak>>10, cp.Acked(resource.EndpointType), len(cp.NACKs()), cp.Opens()-opens, st.Size())
	if grew := peak - before; grew > 64<<10 {
		t.Errorf("Caddy's peak memory grew %d MB over %d MB with the 100 MB view, want under 64 MB", grew>>10, before>>10)
	}
	if st.Size() > 1<<20 {
		t.Errorf("the view file is %d bytes", st.Size())
	}
}
