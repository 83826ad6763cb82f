package main

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/stickylb/stickylb/l4bgp"
	"github.com/stickylb/stickylb/l4xdp"
)

// controlCfg is the node the control tests name: nothing is attached, only the names count.
var controlCfg = l4xdp.Config{Iface: "eth7", PinRoot: "/sys/fs/bpf/stickylb-control-test"}

// testSpeaker is a speaker that is never started: drain and undrain only set its state.
func testSpeaker(t *testing.T) *l4bgp.Speaker {
	t.Helper()
	sp, err := l4bgp.New(l4bgp.Config{ASN: 65001, RouterID: netip.MustParseAddr("192.0.2.10"), NextHop4: netip.MustParseAddr("192.0.2.10"),
		Peers: []l4bgp.Peer{{Addr: netip.MustParseAddr("192.0.2.1"), ASN: 65000}}}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

// listenTest opens the control socket in runDir, closed at the test's end.
func listenTest(t *testing.T, runDir string, sp *l4bgp.Speaker) *controlServer {
	t.Helper()
	c, err := listenControl(runDir, controlCfg, sp, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestDrainSurvivesRestart: a drained node that restarts comes back drained (its speaker
// drained before it announces anything), with the reason given; undrain clears it, and the
// next start announces. The socket is mode 0600 in a directory made 0700.
func TestDrainSurvivesRestart(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	sp := testSpeaker(t)
	c := listenTest(t, runDir, sp)
	if st, err := os.Stat(c.files.sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("control socket: %v, mode %v; want 0600", err, st.Mode())
	}
	if st, _ := os.Stat(runDir); st.Mode().Perm() != 0o700 {
		t.Fatalf("run directory made with mode %v, want 0700", st.Mode().Perm())
	}
	answer, err := askNode(runDir, controlCfg, "drain kernel upgrade")
	if err != nil || !strings.HasPrefix(answer, "ok drained (kernel upgrade)") {
		t.Fatalf("drain: %q, %v", answer, err)
	}
	if d := sp.Status().Drained; d != "kernel upgrade" {
		t.Fatalf("speaker drained for %q", d)
	}
	c.Close()

	sp2 := testSpeaker(t)
	c2 := listenTest(t, runDir, sp2)
	if d := sp2.Status().Drained; !strings.HasPrefix(d, "kernel upgrade") {
		t.Fatalf("restarted after a drain: drained %q, want the drain's reason", d)
	}
	if answer, err := askNode(runDir, controlCfg, "undrain"); err != nil || !strings.HasPrefix(answer, "ok undrained") {
		t.Fatalf("undrain: %q, %v", answer, err)
	}
	if d := sp2.Status().Drained; d != "" {
		t.Fatalf("undrained, still drained for %q", d)
	}
	c2.Close()

	sp3 := testSpeaker(t)
	listenTest(t, runDir, sp3)
	if d := sp3.Status().Drained; d != "" {
		t.Fatalf("restarted after undrain: drained %q", d)
	}
}

// TestControlSocketOneOwner: a second node on the same interface and pin root is refused
// while the first runs; a socket a dead node left (no lock held) is replaced.
func TestControlSocketOneOwner(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	c := listenTest(t, runDir, testSpeaker(t))
	if _, err := listenControl(runDir, controlCfg, testSpeaker(t), zaptest.NewLogger(t)); err == nil || !strings.Contains(err.Error(), "another stickylb xdp") {
		t.Fatalf("a second node on the same socket: %v", err)
	}
	c.Close()
	// A socket left behind: bound, never unlinked.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: c.files.sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	sp := testSpeaker(t)
	listenTest(t, runDir, sp)
	if answer, err := askNode(runDir, controlCfg, "drain"); err != nil || !strings.HasPrefix(answer, "ok") {
		t.Fatalf("drain through the replaced socket: %q, %v", answer, err)
	}
}

// TestRunDirRefused: a run directory others may write to, one owned by another user, or a
// symbolic link is refused before any socket is made (another user could have put a
// socket of theirs where the node's goes).
func TestRunDirRefused(t *testing.T) {
	base := t.TempDir()
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777) // past the umask
	link := filepath.Join(base, "link")
	if err := os.Symlink(base, link); err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{open: "writable by others", link: "not a directory"}
	if os.Geteuid() == 0 {
		other := filepath.Join(base, "other")
		if err := os.Mkdir(other, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		cases[other] = "owned by uid 65534"
	}
	for dir, want := range cases {
		if _, err := listenControl(dir, controlCfg, testSpeaker(t), zaptest.NewLogger(t)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run directory %s: %v, want %q", filepath.Base(dir), err, want)
		}
	}
}

// asUID runs f on a thread of its own whose effective uid is uid (the process keeps root:
// the thread is never reused, it ends with its goroutine).
func asUID(t *testing.T, uid int, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // not unlocked: the thread dies with the goroutine
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			t.Errorf("setresuid: %v", e)
			return
		}
		f()
	}()
	<-done
}

// openUp lets uid 65534 reach dir (and make files in it with write): the tests' way past the
// first line of defence (the run directory's mode) to the second (the peer's credentials).
func openUp(t *testing.T, dir string, write bool) {
	t.Helper()
	mode := os.FileMode(0o711)
	if write {
		mode = 0o777
	}
	for d := dir; d != filepath.Dir(os.TempDir()) && d != "/"; d = filepath.Dir(d) {
		if d == os.TempDir() {
			break
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		mode = 0o711
	}
}

// TestControlRefusesForeignUID: a process of another user that reaches the socket (here
// past its directory's and its own mode) is refused by its credentials and drains nothing;
// and `stickylb xdp drain` sends nothing to a socket another user serves (one squatted
// where no node runs).
func TestControlRefusesForeignUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (to act as another user)")
	}
	runDir := filepath.Join(t.TempDir(), "run")
	sp := testSpeaker(t)
	c := listenTest(t, runDir, sp)
	openUp(t, runDir, false)
	if err := os.Chmod(c.files.sock, 0o666); err != nil {
		t.Fatal(err)
	}
	var answer string
	var err error
	asUID(t, 65534, func() { answer, err = askNode(runDir, controlCfg, "drain") })
	t.Logf("uid 65534 asks for a drain: %q, %v", answer, err)
	if err != nil || !strings.Contains(answer, "error uid 65534 may not drain") {
		t.Fatalf("uid 65534's drain: %q, %v; want refused", answer, err)
	}
	if d := sp.Status().Drained; d != "" {
		t.Fatalf("drained by uid 65534: %q", d)
	}
	c.Close()

	// A squatter: uid 65534 serves a socket where the node's goes.
	openUp(t, runDir, true)
	var ln *net.UnixListener
	asUID(t, 65534, func() {
		ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: c.files.sock, Net: "unix"})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := make([]byte, 64)
		n, _ := conn.Read(buf)
		got <- string(buf[:n])
		conn.Write([]byte("ok drained\n"))
	}()
	answer, err = askNode(runDir, controlCfg, "drain secret reason")
	t.Logf("drain through a squatted socket: %q, %v", answer, err)
	if err == nil || !strings.Contains(err.Error(), "served by uid 65534") {
		t.Fatalf("drain through a socket uid 65534 serves: %q, %v; want refused", answer, err)
	}
	ln.Close()
	select {
	case req := <-got:
		if req != "" {
			t.Fatalf("the squatter read %q", req)
		}
	default:
	}
}
