package caddymodule

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stickylb/stickylb/adsclient"
	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/adstest"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// renames watches dir and returns a count of the files renamed into it under name so far
// (how the source writes its view file: a temporary file renamed over it). Writes are
// watched too: inotify merges an event into the one queued before it when they are alike,
// and the writes of the temporary file come between the renames.
func renames(t *testing.T, dir, name string) func() int {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE); err != nil {
		t.Fatal(err)
	}
	n := 0
	buf := make([]byte, 64<<10)
	return func() int {
		for {
			k, err := unix.Read(fd, buf)
			if err != nil || k <= 0 {
				return n
			}
			for off := 0; off+unix.SizeofInotifyEvent <= k; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				if ev.Mask&unix.IN_MOVED_TO != 0 && string(nameBytes[:clen(nameBytes)]) == name {
					n++
				}
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}
}

func clen(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return len(b)
}

// A control plane that sends a new version every 5 ms costs a Caddy node one view-file
// write a second (the latest) and one "applied" line per kind and 10 s, not one of each per
// version; the file ends with the last view applied.
func TestXDSSourceVersionFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("floods a source with versions for 2 s")
	}
	cp := adstest.Start(t)
	f := poolstest.Parse(t, poolstest.CaddyFleet)
	cs, ls := fleetview.EncodeCaddy(f, nil)
	dir := t.TempDir()
	path := filepath.Join(dir, "view.json")
	writes := renames(t, dir, "view.json")
	core, logs := observer.New(zap.InfoLevel)
	cfg := adsclient.Config{Server: cp.Addr, NodeID: "flood/caddy", UserAgentName: fleetview.UserAgentCaddy}
	s, err := startXDSSub(cfg, t.Name(), path, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { xdsTable.set(t.Name(), nil) })
	const flood = 2 * time.Second
	end := time.Now().Add(flood)
	versions := 0
	var last uint32
	for time.Now().Before(end) {
		versions++
		last = uint32(versions%9000 + 1)
		// A new message each version: the control plane may still be marshalling the last.
		l := proto.Clone(ls[0]).(*endpointv3.ClusterLoadAssignment)
		l.Endpoints[0].LbEndpoints[0].LoadBalancingWeight = wrapperspb.UInt32(last)
		cp.Set(t, cs, append([]*endpointv3.ClusterLoadAssignment{l}, ls[1:]...))
		time.Sleep(5 * time.Millisecond) // the flood's pace: a version every 5 ms
	}
	testwait.For(t, 10*time.Second, "the last version applied", func() (bool, string) {
		v := s.view.Load()
		return v != nil && v.Services["api"].Backends[0].Weight == last, "not yet"
	})
	applies := logs.FilterMessage("applied an xDS view").Len() + logs.FilterMessage("applied an xDS update").Len()
	// The last view is on disk within a second of being applied; Destruct writes it at once.
	if err := s.Destruct(); err != nil {
		t.Fatal(err)
	}
	n := writes()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var sv savedView
	if err := json.Unmarshal(b, &sv); err != nil || sv.View == nil || sv.View.Services["api"].Backends[0].Weight != last {
		t.Fatalf("the saved view is not the last applied (weight %d): %v %.200s", last, err, b)
	}
	t.Logf("%d versions in %s: %d view-file writes, %d \"applied\" lines", versions, flood, n, applies)
	if limit := int(flood/time.Second) + 2; n > limit {
		t.Errorf("%d view-file writes for %d versions in %s, want at most %d (one a second, and the last)", n, versions, flood, limit)
	}
	if applies > 4 {
		t.Errorf("%d \"applied\" lines for %d versions in %s, want at most 4 (one at once and one held, per kind)", applies, versions, flood)
	}
}
