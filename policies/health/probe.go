package health

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// prober runs one probe against an address prepared by probeAddress. It
// returns within the context's deadline (the config's timeout) and reports
// the outcome as a short reason string prefixed with the protocol.
type prober interface {
	probe(ctx context.Context, addr string) (outcome, string)
}

// proberFault names err's cause when it is the prober's own (its permissions,
// descriptors or buffers) rather than the backend's: such a probe is
// inconclusive. A host that does not answer (EHOSTUNREACH, timeouts,
// refusals) is the backend's fault and is not listed here.
func proberFault(err error) (cause string, ok bool) {
	for _, f := range []struct {
		errno syscall.Errno
		name  string
	}{
		{syscall.EPERM, "EPERM"}, {syscall.EACCES, "EACCES"}, {syscall.EMFILE, "EMFILE"},
		{syscall.ENFILE, "ENFILE"}, {syscall.ENOBUFS, "ENOBUFS"},
	} {
		if errors.Is(err, f.errno) {
			return f.name + " (" + f.errno.Error() + ")", true
		}
	}
	return "", false
}

// failure is the outcome of a probe that ended in err: inconclusive for the
// prober's own faults, failed otherwise.
func failure(proto string, err error) (outcome, string) {
	if cause, ok := proberFault(err); ok {
		return inconclusive, proto + ": prober fault: " + cause
	}
	return failed, proto + ": " + describe(err)
}

// maxBodyDrain bounds how much of an HTTP health response is read. The
// connection is closed after every probe anyway (no keep-alive), so the
// drain is a courtesy that lets small responses finish cleanly; a backend
// that streams forever costs at most this much.
const maxBodyDrain = 16 << 10

type tcpProber struct{}

func (tcpProber) probe(ctx context.Context, addr string) (outcome, string) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return failure("tcp", err)
	}
	conn.Close()
	return passed, "tcp: connected"
}

type httpProber struct {
	client  *http.Client
	path    *url.URL
	host    string
	expects func(int) bool
}

func newHTTPProber(cfg Config) (*httpProber, error) {
	u, err := url.ParseRequestURI(cfg.Path)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{
		// A health check must reach the backend itself, never a proxy named
		// in the environment.
		Proxy:       nil,
		DialContext: (&net.Dialer{}).DialContext,
		// One connection per probe: a probe must prove that the backend
		// accepts connections now, which a reused idle connection does not.
		DisableKeepAlives:      true,
		DisableCompression:     true,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &httpProber{
		client: &http.Client{
			Transport: tr,
			// A redirect is the backend's answer; following it would probe
			// some other host.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		path:    u,
		host:    cfg.Host,
		expects: cfg.expects,
	}, nil
}

func (p *httpProber) probe(ctx context.Context, addr string) (outcome, string) {
	u := *p.path
	u.Scheme, u.Host = "http", addr
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://placeholder/", nil)
	if err != nil {
		return failed, "http: " + err.Error()
	}
	// Set the URL directly: addr may hold an IPv6 zone that a URL string
	// would need escaped.
	req.URL = &u
	req.Host = p.host
	req.Close = true
	req.Header.Set("User-Agent", "stickylb-health-check")
	resp, err := p.client.Do(req)
	if err != nil {
		return failure("http", err)
	}
	io.CopyN(io.Discard, resp.Body, maxBodyDrain)
	resp.Body.Close()
	result := "http: status " + strconv.Itoa(resp.StatusCode)
	if p.expects(resp.StatusCode) {
		return passed, result
	}
	return failed, result
}

// describe turns a probe error into a short, stable reason: the errno or
// "timeout" rather than a message that repeats the address.
func describe(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH):
		return "host unreachable"
	case errors.Is(err, syscall.ENETUNREACH):
		return "network unreachable"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "address not available"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}

// probeAddress derives what a probe dials from a target's address: host:port
// for tcp and http, with the port replaced by the config's Port when set;
// the bare host for icmp. An address without a port is accepted where a port
// is not needed (icmp, or Port set).
func probeAddress(cfg Config, address string) (string, error) {
	if address == "" {
		return "", errors.New("empty address")
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		// Not host:port; accept a bare host or IP (IPv6 maybe bracketed).
		host, port = address, ""
		if len(host) > 1 && host[0] == '[' && host[len(host)-1] == ']' {
			host = host[1 : len(host)-1]
		}
		if strings.ContainsAny(host, "[]") || (strings.Contains(host, ":") && net.ParseIP(stripZone(host)) == nil) {
			return "", errors.New("address " + strconv.Quote(address) + " is neither host:port nor a host")
		}
	}
	if host == "" {
		return "", errors.New("address " + strconv.Quote(address) + " has no host")
	}
	if cfg.Protocol == ICMP {
		return host, nil
	}
	if cfg.Port != 0 {
		port = strconv.Itoa(cfg.Port)
	}
	if port == "" {
		return "", errors.New("address " + strconv.Quote(address) + " has no port and the check sets none")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", errors.New("address " + strconv.Quote(address) + " has an invalid port")
	}
	return net.JoinHostPort(host, port), nil
}

func stripZone(h string) string {
	if i := strings.IndexByte(h, '%'); i >= 0 {
		return h[:i]
	}
	return h
}
