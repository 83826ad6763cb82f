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
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/stickylb/stickylb/l4bgp"
	"github.com/stickylb/stickylb/l4xdp"
)

// The control socket of a running `stickylb xdp --bgp-*`: `stickylb xdp drain` and
// `undrain` find the node by its interface and pin root. A bpffs holds no sockets, so the
// socket lives in the run directory (--run-dir, default /run/stickylb), named after the
// interface and the pin directory, so that several nodes on one host stay apart. The
// directory must be the node's user's own and writable by nobody else (a socket anyone
// could create there could be squatted before the node binds it); a lock file beside the
// socket says which node owns it (a second node on the same interface and pin root is
// refused, a socket left by a node that died is replaced). The socket is mode 0600, and
// both ends check the other's credentials (SO_PEERCRED): only root or the node's own user
// may drain it, and the command trusts only a node run by root or by its own user. The
// drain state is kept beside them, so that a node drained and restarted stays drained.

// DefaultRunDir holds the control sockets, their lock files and the drain state.
const DefaultRunDir = "/run/stickylb"

// controlFiles are the paths of one node's control socket, lock file and drain state.
type controlFiles struct{ sock, lock, drained string }

// controlPaths names the files of the node pinned under cfg, in runDir.
func controlPaths(runDir string, cfg l4xdp.Config) (controlFiles, error) {
	root := cfg.PinRoot
	if root == "" {
		root = l4xdp.DefaultPinRoot
	}
	if abs, err := filepath.Abs(root); err == nil {
		root = abs
	}
	sum := sha256.Sum256([]byte(filepath.Join(root, cfg.Iface)))
	base := filepath.Join(runDir, "xdp-"+cfg.Iface+"-"+hex.EncodeToString(sum[:6]))
	f := controlFiles{sock: base + ".sock", lock: base + ".lock", drained: base + ".drained"}
	if len(f.sock) > 107 { // sun_path holds 108 bytes with its NUL
		return f, fmt.Errorf("control socket %s: longer than a unix socket path may be (107 bytes): choose a shorter --run-dir", f.sock)
	}
	return f, nil
}

// checkRunDir refuses a run directory that someone other than root or this process's user
// owns, or that others may write to: they could put their own socket where a node's goes.
func checkRunDir(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.IsDir():
		return fmt.Errorf("run directory %s: not a directory (a symbolic link is refused too)", dir)
	case !ok:
		return fmt.Errorf("run directory %s: cannot read its owner", dir)
	case sys.Uid != 0 && int(sys.Uid) != os.Geteuid():
		return fmt.Errorf("run directory %s: owned by uid %d, not by root or uid %d", dir, sys.Uid, os.Geteuid())
	case st.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("run directory %s: writable by others (mode %04o): want 0700", dir, st.Mode().Perm())
	}
	return nil
}

// controlServer answers drain and undrain.
type controlServer struct {
	ln    *net.UnixListener
	lock  *os.File
	files controlFiles
	sp    *l4bgp.Speaker
	log   *zap.Logger
}

// listenControl opens the control socket of the node pinned under cfg, in runDir (made
// 0700 when missing), and drains sp if the node was drained when it last ran.
func listenControl(runDir string, cfg l4xdp.Config, sp *l4bgp.Speaker, log *zap.Logger) (*controlServer, error) {
	files, err := controlPaths(runDir, cfg)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return nil, fmt.Errorf("run directory: %w", err)
	}
	if err := checkRunDir(runDir); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(files.lock, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("control socket's lock file: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("control socket %s: another stickylb xdp runs on %s with this pin root (it holds %s)", files.sock, cfg.Iface, files.lock)
		}
		return nil, fmt.Errorf("locking %s: %w", files.lock, err)
	}
	// Holding the lock, whatever socket is there was left by a node that died.
	if err := os.Remove(files.sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		lock.Close()
		return nil, fmt.Errorf("removing the control socket a stopped node left: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: files.sock, Net: "unix"})
	if err == nil {
		// The directory admits nobody else meanwhile; the mode says it on the file too.
		err = os.Chmod(files.sock, 0o600)
		if err != nil {
			ln.Close()
		}
	}
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("control socket (for stickylb xdp drain): %w", err)
	}
	c := &controlServer{ln: ln, lock: lock, files: files, sp: sp, log: log}
	if why, ok := c.readDrained(); ok {
		sp.Drain(why)
	}
	go c.serve()
	return c, nil
}

// drainedNote marks a drain reason read back after a restart.
const drainedNote = " (drained before the node restarted)"

// readDrained reads the drain state a previous run of the node left: why, and whether it
// was drained. An unreadable state file drains the node too (an operator drained it; a
// node must not come back routed by accident), and says so.
func (c *controlServer) readDrained() (string, bool) {
	data, err := os.ReadFile(c.files.drained)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", false
	case err != nil:
		c.log.Error("reading the drain state; staying drained until stickylb xdp undrain", zap.Error(err))
		return "the drain state could not be read: " + err.Error(), true
	}
	why := strings.TrimSuffix(strings.TrimSpace(string(data)), drainedNote)
	if len(why) > 512 {
		why = why[:512]
	}
	return why + drainedNote, true
}

// saveDrained records (why not empty) or clears the drain state for the next run.
func (c *controlServer) saveDrained(why string) error {
	if why == "" {
		if err := os.Remove(c.files.drained); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	tmp := c.files.drained + ".new"
	if err := os.WriteFile(tmp, []byte(why+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, c.files.drained)
}

// Close stops answering, removes the socket and lets go of the lock (the lock file and the
// drain state stay).
func (c *controlServer) Close() {
	if c != nil {
		c.ln.Close() // unlinks the socket
		c.lock.Close()
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
		if err := c.saveDrained(why); err != nil {
			fmt.Fprintf(conn, "error recording the drain state (nothing changed): %v\n", err)
			return
		}
		already := c.sp.Drain(why)
		fmt.Fprintf(conn, "ok drained (%s): every VIP withdrawn; the node forwards what still arrives%s\n", why,
			map[bool]string{true: " (it was drained already)"}[already])
	case "undrain":
		if err := c.saveDrained(""); err != nil {
			fmt.Fprintf(conn, "error clearing the drain state (nothing changed): %v\n", err)
			return
		}
		was := c.sp.Undrain()
		fmt.Fprintf(conn, "ok undrained: the VIPs are announced again%s\n", map[bool]string{false: " (it was not drained)"}[was])
	default:
		fmt.Fprintf(conn, "error unknown request %q\n", cmd)
	}
}

// allowed admits root and the node's own user.
func allowed(conn *net.UnixConn) error {
	uid, err := peerUID(conn)
	if err != nil {
		return err
	}
	if uid != 0 && int(uid) != os.Geteuid() {
		return fmt.Errorf("uid %d may not drain this node (root or uid %d only)", uid, os.Geteuid())
	}
	return nil
}

// peerUID is the user of the process at the other end of conn (its effective uid when it
// connected or listened).
func peerUID(conn *net.UnixConn) (uint32, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("reading the other end's credentials: %w", cerr)
	}
	return cred.Uid, nil
}

// xdpControl is `stickylb xdp drain|undrain --iface IF [--pin-root DIR] [--run-dir DIR]
// [--reason TEXT]`.
func xdpControl(sub string, args []string, stdout, stderr io.Writer) int {
	synopsis := fmt.Sprintf("usage: stickylb xdp %s --iface IF [--pin-root DIR] [--run-dir DIR]%s\n", sub, map[bool]string{true: " [--reason TEXT]"}[sub == "drain"])
	fs := newFlagSet("xdp "+sub, xdpUsage, stderr) // -h: every xdp form, as the other subcommands
	iface := fs.String("iface", "", "the interface the node forwards on")
	pinRoot := fs.String("pin-root", l4xdp.DefaultPinRoot, "the node's --pin-root")
	runDir := fs.String("run-dir", DefaultRunDir, "the node's --run-dir")
	reason := fs.String("reason", "", "why (drain only): logged by the node and shown on its status page")
	if err := fs.Parse(args); err != nil {
		return parseError(err)
	}
	if *iface == "" || fs.NArg() != 0 || sub == "undrain" && *reason != "" {
		fmt.Fprint(stderr, synopsis)
		return 2
	}
	answer, err := askNode(*runDir, l4xdp.Config{Iface: *iface, PinRoot: *pinRoot}, sub+" "+strings.ReplaceAll(*reason, "\n", " "))
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp %s: %s under %s: %v\n", sub, *iface, *pinRoot, err)
		return 1
	}
	status, msg, _ := strings.Cut(answer, " ")
	if status != "ok" {
		fmt.Fprintf(stderr, "stickylb xdp %s: %s\n", sub, msg)
		return 1
	}
	fmt.Fprintln(stdout, msg)
	return 0
}

// askNode sends one request to the node pinned under cfg and returns its answer's line. It
// talks only to a node run by root or by this process's user: a socket someone else put
// there gets no request.
func askNode(runDir string, cfg l4xdp.Config, request string) (string, error) {
	files, err := controlPaths(runDir, cfg)
	if err != nil {
		return "", err
	}
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: files.sock, Net: "unix"})
	if err != nil {
		if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, os.ErrNotExist) {
			err = fmt.Errorf("no stickylb xdp with BGP runs on this interface and pin root (no socket at %s)", files.sock)
		}
		return "", err
	}
	defer conn.Close()
	uid, err := peerUID(conn)
	if err != nil {
		return "", err
	}
	if uid != 0 && int(uid) != os.Geteuid() {
		return "", fmt.Errorf("%s is served by uid %d, neither root nor uid %d: not a node of ours, nothing sent", files.sock, uid, os.Geteuid())
	}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "%s\n", request)
	answer, err := bufio.NewReader(io.LimitReader(conn, 1024)).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("reading the node's answer: %w", err)
	}
	return strings.TrimSpace(answer), nil
}
