package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
)

// xdpProc is `stickylb xdp` running under `ip netns exec` in a namespace of a test's kit.
type xdpProc struct {
	cmd *exec.Cmd
	// logs is what it logged so far (its stderr, written straight into a file: a
	// strings.Builder would be written by exec's copying goroutine while the test reads it).
	logs func() string
	// stop ends it with SIGTERM (the loader leaves its program and pins in place) and waits;
	// the test's end does too, and shows the log when the test failed.
	stop func()
}

// startXDPProc runs bin with args in namespace ns of kit and waits, a minute at most, for
// its "ready".
func startXDPProc(t *testing.T, kit *netnstest.Kit, ns, bin string, args ...string) *xdpProc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", kit.Name(ns), bin}, args...)...)
	logf, err := os.Create(filepath.Join(t.TempDir(), "xdp.log"))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	cmd.Stderr = logf
	p := &xdpProc{cmd: cmd, logs: func() string { b, _ := os.ReadFile(logf.Name()); return string(b) }}
	stdout, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var once sync.Once
	p.stop = func() {
		once.Do(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
			cancel()
			logf.Close()
			if t.Failed() {
				t.Logf("stickylb %s log:\n%s", strings.Join(args, " "), p.logs())
			}
		})
	}
	t.Cleanup(p.stop)
	// The minute of ctx bounds this read: the process is killed and stdout closes.
	for sc := bufio.NewScanner(stdout); sc.Scan(); {
		if sc.Text() == "ready" {
			return p
		}
	}
	cmd.Wait()
	t.Fatalf("stickylb xdp did not start: %s", p.logs())
	return nil
}
