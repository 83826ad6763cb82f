package main

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/stickylb/stickylb/internal/hostcheck"
)

// hostList is a flag of host names, repeated or comma-separated (--admin-host).
type hostList []string

func (h *hostList) String() string { return strings.Join(*h, ",") }

func (h *hostList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*h = append(*h, p)
		}
	}
	return nil
}

// httpAddr is an address flag of an unauthenticated HTTP endpoint and the more Host names
// it answers (--admin-host).
type httpAddr struct {
	addr  string
	hosts hostList
}

// adminHostHint says, in a refusal, which Host names an endpoint answers.
const adminHostHint = "it answers its listen address, localhost when that is loopback, any IP address when it listens on all of them, and the names given with --admin-host"

// adminNames are the Host names the HTTP endpoint at addr answers, and hosts (see
// internal/hostcheck): a flag error when addr or a name is malformed.
func adminNames(addr string, hosts []string) (*hostcheck.Names, error) {
	names, err := hostcheck.ForListen(addr, hosts...)
	if err != nil {
		return nil, fmt.Errorf("--admin-host: %w", err)
	}
	return names, nil
}

// serveAdmin serves h on addr for the daemons' unauthenticated HTTP endpoints (`stickylb
// xds --admin`, `stickylb xdp --metrics`): only to requests whose Host is one of the
// address's names or hosts, so that a page from another name that a DNS rebinding pointed
// at the address reads and changes nothing. It returns the address bound and the function
// that stops serving.
func serveAdmin(addr string, hosts []string, h http.Handler, log *zap.Logger) (string, func(), error) {
	names, err := adminNames(addr, hosts)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	guarded := names.Guard(h, adminHostHint, func(r *http.Request) {
		log.Warn("refused an HTTP request for a name this endpoint does not have (DNS rebinding, or a name to add with --admin-host)",
			zap.String("host", logCut(r.Host)), zap.String("remote", r.RemoteAddr), zap.String("path", logCut(r.URL.Path)))
	})
	return ln.Addr().String(), serveHTTP(ln, guarded, serverLimits()), nil
}

// httpLimits bound what one client of an HTTP server (the admin endpoints, the change API)
// costs: a client that sends slowly, holds connections idle or sends huge headers.
type httpLimits struct {
	readHeader, read, write, idle time.Duration
	maxHeaderBytes                int
}

// serverLimits are the limits every HTTP server of the command runs with.
func serverLimits() httpLimits {
	return httpLimits{readHeader: 5 * time.Second, read: 30 * time.Second, // 1 MiB of pools file at 35 KB/s
		write: 30 * time.Second, idle: 60 * time.Second, maxHeaderBytes: 64 << 10}
}

// serveHTTP serves h on ln within l until the returned function closes it.
func serveHTTP(ln net.Listener, h http.Handler, l httpLimits) (closeIt func()) {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: l.readHeader, ReadTimeout: l.read,
		WriteTimeout: l.write, IdleTimeout: l.idle, MaxHeaderBytes: l.maxHeaderBytes}
	go func() { _ = hs.Serve(ln) }()
	return func() { hs.Close() }
}

// checkAdminHosts refuses --admin-host without the address flag it goes with (addrFlag:
// --admin, --metrics), or with a name that is not one.
func checkAdminHosts(addrFlag, addr string, hosts []string) error {
	if addr == "" {
		if len(hosts) > 0 {
			return fmt.Errorf("--admin-host goes with %s", addrFlag)
		}
		return nil
	}
	_, err := adminNames(addr, hosts)
	return err
}

// logCut keeps a client's string to 256 bytes in a log line.
func logCut(v string) string {
	if len(v) > 256 {
		return v[:256] + "..."
	}
	return v
}
