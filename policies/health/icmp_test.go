package health

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"golang.org/x/sys/unix"
)

// requireICMP skips when this process can open neither a ping socket nor a
// raw socket for the family (CI runs as root, so there it never skips).
func requireICMP(t *testing.T, v6 bool) icmpMode {
	t.Helper()
	var p icmpProber
	c, mode, err := p.listen(v6)
	if err != nil {
		t.Skipf("ICMP probes impossible here: %v", err)
	}
	c.Close()
	return mode
}

func probeICMP(p *icmpProber, host string, timeout time.Duration) (bool, string, time.Duration) {
	// start before the deadline is set, so a probe that ends at its deadline has taken at
	// least timeout (the other order let a preempted goroutine measure 196.8 ms of 200).
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, result := p.probe(ctx, host)
	ok := out == passed
	return ok, result, time.Since(start)
}

func TestICMPLoopback(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "::1", "127.0.0.2"} {
		t.Run(host, func(t *testing.T) {
			mode := requireICMP(t, strings.Contains(host, ":"))
			var p icmpProber
			for i := range 3 {
				ok, result, took := probeICMP(&p, host, time.Second)
				if !ok || result != "icmp: echo reply" {
					t.Fatalf("probe %d of %s via %v: ok=%v %q after %v", i, host, mode, ok, result, took)
				}
			}
			t.Logf("%s: echo replies via %v", host, mode)
		})
	}
}

// TestICMPChecker runs a Checker over IPv4 and IPv6 loopback targets.
func TestICMPChecker(t *testing.T) {
	requireICMP(t, false)
	requireICMP(t, true)
	cfg := Config{Protocol: ICMP, Interval: 200 * time.Millisecond, Timeout: 100 * time.Millisecond}
	c, err := NewChecker(cfg, AllowShortIntervals())
	if err != nil {
		t.Fatal(err)
	}
	// Ports in the address are the traffic port and are ignored by icmp.
	if err := c.SetTargets([]Target{{ID: "v4", Address: "127.0.0.1:443"}, {ID: "v6", Address: "[::1]:443"}}); err != nil {
		t.Fatal(err)
	}
	ch, cancel := c.Subscribe(4)
	defer cancel()
	col := collect(ch)
	runChecker(t, c)
	for _, id := range []string{"v4", "v6"} {
		tr, _ := col.waitTransition(t, firstProbeBound(cfg)+schedSlack, 0, id+" known", func(tr Transition) bool { return tr.ID == id })
		if !tr.Healthy || tr.Reason != "icmp: echo reply" {
			t.Errorf("%s: %+v", id, tr)
		}
	}
	// Several more probes must keep passing (replies matched to the right
	// probe, no stale reply taken for a new one).
	testwait.For(t, 10*cfg.Interval, "4 consecutive successes on both", func() (bool, string) {
		snap := c.Snapshot()
		for _, st := range snap {
			if st.ConsecutiveSuccesses < 4 || st.State != Healthy {
				return false, fmt.Sprintf("%+v", snap)
			}
		}
		return true, ""
	})
}

// inNetns runs f on an OS thread moved into a new, empty network namespace,
// where the test can break ICMP without touching the host. The thread is
// never unlocked, so it dies with the goroutine and the namespace with it.
func inNetns(t *testing.T, f func() error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		errc <- f()
	}()
	if err := testwait.Recv(t, errc, 10*time.Second, "the netns test"); err != nil {
		t.Fatal(err)
	}
}

// loUp brings up lo in the calling thread's network namespace.
func loUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS lo: %w", err)
	}
	return nil
}

// sysctl writes a network sysctl of the calling thread's namespace.
func sysctl(name, value string) error {
	return os.WriteFile("/proc/sys/"+strings.ReplaceAll(name, ".", "/"), []byte(value), 0)
}

func readSysctl(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(name, ".", "/"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestICMPFailures makes echo fail in a namespace of the test's own: with lo
// down sending fails at once; with echo ignored the probe times out.
func TestICMPFailures(t *testing.T) {
	const timeout = 200 * time.Millisecond
	hostIgnore4 := readSysctl(t, "net.ipv4.icmp_echo_ignore_all")
	for _, mode := range []icmpMode{icmpRaw, icmpDatagram} {
		t.Run(mode.String(), func(t *testing.T) {
			inNetns(t, func() error {
				if err := sysctl("net.ipv4.ping_group_range", "0 2147483647"); err != nil {
					return err
				}
				p := &icmpProber{forced: mode}
				// With lo down there is no route to 127.0.0.1, and ::1 is
				// not even configured.
				for host, want := range map[string]string{"127.0.0.1": "icmp: network unreachable", "::1": "icmp: address not available"} {
					ok, result, took := probeICMP(p, host, timeout)
					if ok || result != want || took > timeout {
						return fmt.Errorf("%s with lo down: ok=%v %q after %v, want %q at once", host, ok, result, took, want)
					}
				}
				if err := loUp(); err != nil {
					return err
				}
				for _, host := range []string{"127.0.0.1", "::1"} {
					if ok, result, took := probeICMP(p, host, time.Second); !ok {
						return fmt.Errorf("%s with lo up: ok=%v %q after %v", host, ok, result, took)
					}
				}
				if err := sysctl("net.ipv4.icmp_echo_ignore_all", "1"); err != nil {
					return err
				}
				if err := sysctl("net.ipv6.icmp.echo_ignore_all", "1"); err != nil {
					return err
				}
				for _, host := range []string{"127.0.0.1", "::1"} {
					ok, result, took := probeICMP(p, host, timeout)
					if ok || result != "icmp: timeout" || took < timeout || took > timeout+schedSlack {
						return fmt.Errorf("%s ignoring echo: ok=%v %q after %v, want icmp: timeout after %v", host, ok, result, took, timeout)
					}
				}
				return nil
			})
		})
	}
	if got := readSysctl(t, "net.ipv4.icmp_echo_ignore_all"); got != hostIgnore4 {
		t.Fatalf("the host's icmp_echo_ignore_all changed from %s to %s", hostIgnore4, got)
	}
}

// TestICMPCancel: an in-flight echo wait ends when its context is cancelled,
// not at the timeout.
func TestICMPCancel(t *testing.T) {
	inNetns(t, func() error {
		if err := loUp(); err != nil {
			return err
		}
		if err := sysctl("net.ipv4.icmp_echo_ignore_all", "1"); err != nil {
			return err
		}
		p := &icmpProber{forced: icmpRaw}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		time.AfterFunc(100*time.Millisecond, cancel)
		start := time.Now()
		out, _ := p.probe(ctx, "127.0.0.1")
		ok := out == passed
		if took := time.Since(start); ok || took > 2*time.Second {
			return fmt.Errorf("cancelled probe: ok=%v after %v, want failure soon after 100ms", ok, took)
		}
		if !errors.Is(ctx.Err(), context.Canceled) {
			return fmt.Errorf("context: %v", ctx.Err())
		}
		return nil
	})
}
