package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/stickylb/stickylb/l4bgp"
	"github.com/stickylb/stickylb/l4xdp"
)

// The control socket of a running `stickylb xdp --bgp-*`: `stickylb xdp drain` and
// `undrain` find the node by its interface and pin root. A bpffs holds no sockets, so the
// socket is an abstract one named after the pin directory (PIN_ROOT/IFACE): several nodes
// on one host stay apart, nothing is left behind by a node that dies, and it lives in the
// node's network namespace. Only root, or the node's own user, may use it (checked from
// the connection's credentials).

// controlName is the abstract socket name of the node pinned under cfg.
func controlName(cfg l4xdp.Config) string {
	root := cfg.PinRoot
	if root == "" {
		root = l4xdp.DefaultPinRoot
	}
	if abs, err := filepath.Abs(root); err == nil {
		root = abs
	}
	name := "stickylb-xdp:" + filepath.Join(root, cfg.Iface)
	if len(name) > 100 { // the kernel's limit is 107 bytes
		sum := sha256.Sum256([]byte(name))
		name = "stickylb-xdp:" + hex.EncodeToString(sum[:16])
	}
	return "@" + name
}

// controlServer answers drain and undrain.
type controlServer struct {
	ln  *net.UnixListener
	sp  *l4bgp.Speaker
	log *zap.Logger
}

// listenControl opens the control socket of the node pinned under cfg.
func listenControl(cfg l4xdp.Config, sp *l4bgp.Speaker, log *zap.Logger) (*controlServer, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: controlName(cfg), Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket (for stickylb xdp drain): %w (is another stickylb xdp running on %s with this pin root?)", err, cfg.Iface)
	}
	c := &controlServer{ln: ln, sp: sp, log: log}
	go c.serve()
	return c, nil
}

// Close stops answering.
func (c *controlServer) Close() {
	if c != nil {
		c.ln.Close()
	}
}

func (c *controlServer) serve() {
	for {
		conn, err := c.ln.AcceptUnix()
		if err != nil {
			return
		}
		go c.handle(conn)
	}
}

// handle answers one request: a line "drain [why]" or "undrain", and one line back, "ok
// ..." or "error ...".
func (c *controlServer) handle(conn *net.UnixConn) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if err := allowed(conn); err != nil {
		fmt.Fprintf(conn, "error %v\n", err)
		c.log.Warn("control socket: request refused", zap.Error(err))
		return
	}
	line, err := bufio.NewReader(io.LimitReader(conn, 512)).ReadString('\n')
	if err != nil {
		return
	}
	cmd, why, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch cmd {
	case "drain":
		if why == "" {
			why = "stickylb xdp drain"
		}
		already := c.sp.Drain(why)
		fmt.Fprintf(conn, "ok drained (%s): every VIP withdrawn; the node forwards what still arrives%s\n", why,
			map[bool]string{true: " (it was drained already)"}[already])
	case "undrain":
		was := c.sp.Undrain()
		fmt.Fprintf(conn, "ok undrained: the VIPs are announced again%s\n", map[bool]string{false: " (it was not drained)"}[was])
	default:
		fmt.Fprintf(conn, "error unknown request %q\n", cmd)
	}
}

// allowed admits root and the node's own user.
func allowed(conn *net.UnixConn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("reading the caller's credentials: %w", cerr)
	}
	if cred.Uid != 0 && int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("uid %d may not drain this node (root or uid %d only)", cred.Uid, os.Geteuid())
	}
	return nil
}

// xdpControl is `stickylb xdp drain|undrain --iface IF [--pin-root DIR] [--reason TEXT]`.
func xdpControl(sub string, args []string, stdout, stderr io.Writer) int {
	synopsis := fmt.Sprintf("usage: stickylb xdp %s --iface IF [--pin-root DIR]%s\n", sub, map[bool]string{true: " [--reason TEXT]"}[sub == "drain"])
	fs := newFlagSet("xdp "+sub, xdpUsage, stderr) // -h: every xdp form, as the other subcommands
	iface := fs.String("iface", "", "the interface the node forwards on")
	pinRoot := fs.String("pin-root", l4xdp.DefaultPinRoot, "the node's --pin-root")
	reason := fs.String("reason", "", "why (drain only): logged by the node and shown on its status page")
	if err := fs.Parse(args); err != nil {
		return parseError(err)
	}
	if *iface == "" || fs.NArg() != 0 || sub == "undrain" && *reason != "" {
		fmt.Fprint(stderr, synopsis)
		return 2
	}
	cfg := l4xdp.Config{Iface: *iface, PinRoot: *pinRoot}
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: controlName(cfg), Net: "unix"})
	if err != nil {
		if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, os.ErrNotExist) {
			err = errors.New("no stickylb xdp with BGP runs on this interface and pin root (in this network namespace)")
		}
		fmt.Fprintf(stderr, "stickylb xdp %s: %s under %s: %v\n", sub, *iface, *pinRoot, err)
		return 1
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "%s %s\n", sub, strings.ReplaceAll(*reason, "\n", " "))
	answer, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp %s: reading the node's answer: %v\n", sub, err)
		return 1
	}
	status, msg, _ := strings.Cut(strings.TrimSpace(answer), " ")
	if status != "ok" {
		fmt.Fprintf(stderr, "stickylb xdp %s: %s\n", sub, msg)
		return 1
	}
	fmt.Fprintln(stdout, msg)
	return 0
}
