package adsclient

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/stickylb/stickylb/internal/certpool"
)

// Config says where the control plane is and who this node is.
type Config struct {
	// Server is the control plane's host:port.
	Server string
	// Servers lists the control plane's replicas (host:port each), tried in order: the
	// client stays on one while its stream lasts, tries the next at once when a stream
	// fails or is refused, and backs off only between full rounds of the list. Server, when
	// set, is the list's first entry.
	Servers []string
	// NodeID is sent as node.id; the control plane keys its per-node state by it, so it must
	// be unique in the fleet (and stable across restarts of this node).
	NodeID string
	// Cluster is sent as node.cluster (optional; Envoy sends its service cluster there).
	Cluster string
	// Zone is sent as node.locality.zone: the control plane shapes zone-aware endpoints by it.
	Zone string
	// UserAgentName and UserAgentVersion are sent as node.user_agent_name and
	// node.user_agent_version (Envoy sends "envoy" and its version). Default name "stickylb".
	UserAgentName, UserAgentVersion string

	// TLS, when any file is set, makes the connection TLS (mTLS with CertFile and KeyFile).
	TLS TLS
	// Backoff bounds the waits between connection attempts.
	Backoff Backoff
	// Keepalive is the interval of HTTP/2 pings on an idle stream, so a control plane that
	// vanished without closing the connection (a partition) is noticed. The server must permit
	// it (`stickylb xds` permits 10 s). Default 30 s; negative turns pings off.
	Keepalive time.Duration
	// MaxMessageBytes bounds one response. gRPC's default of 4 MiB holds about 170,000 bare
	// endpoints in one EDS response, far fewer with host names and metadata; default 256 MiB.
	MaxMessageBytes int
}

// TLS holds the files of the client's TLS configuration. Files are read again on every
// connection attempt, so rotated certificates are picked up on the next reconnect.
type TLS struct {
	// CAFile holds the PEM certificates that may sign the server's; empty means the system's.
	CAFile string
	// CertFile and KeyFile are the client's certificate and key for mTLS (both or neither).
	CertFile, KeyFile string
	// ServerName overrides the name the server's certificate is checked against (by default
	// the host part of Config.Server).
	ServerName string
}

func (t TLS) enabled() bool { return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" }

// Backoff is exponential backoff with full jitter: the n-th wait after a failure is uniform
// in [0, min(Max, Initial*2^n)], so a fleet that lost its control plane at one instant does
// not reconnect in lockstep. It returns to Initial after a healthy stream (one that received
// a response).
type Backoff struct {
	// Initial is the first ceiling (default 250 ms).
	Initial time.Duration
	// Max caps the ceiling (default 30 s).
	Max time.Duration
}

const (
	defaultInitial   = 250 * time.Millisecond
	defaultMax       = 30 * time.Second
	defaultKeepalive = 30 * time.Second
	defaultUserAgent = "stickylb"
	defaultMaxMsg    = 256 << 20
)

// withDefaults fills the zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	if c.Server != "" && (len(c.Servers) == 0 || c.Servers[0] != c.Server) {
		c.Servers = append([]string{c.Server}, c.Servers...)
	}
	if len(c.Servers) == 0 {
		return c, errors.New("adsclient: no server address")
	}
	for _, s := range c.Servers {
		if s == "" {
			return c, errors.New("adsclient: an empty server address in the list")
		}
	}
	c.Server = strings.Join(c.Servers, ",")
	if c.NodeID == "" {
		return c, errors.New("adsclient: no node id")
	}
	if c.UserAgentName == "" {
		c.UserAgentName = defaultUserAgent
	}
	if c.Backoff.Initial <= 0 {
		c.Backoff.Initial = defaultInitial
	}
	if c.Backoff.Max <= 0 {
		c.Backoff.Max = defaultMax
	}
	if c.Backoff.Max < c.Backoff.Initial {
		return c, fmt.Errorf("adsclient: backoff max %s is below its initial %s", c.Backoff.Max, c.Backoff.Initial)
	}
	if c.Keepalive == 0 {
		c.Keepalive = defaultKeepalive
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = defaultMaxMsg
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		return c, errors.New("adsclient: the TLS certificate and key go together")
	}
	if c.TLS.enabled() {
		// Read the files once now, so a wrong path fails at start, not in a retry loop.
		if _, err := c.TLS.config(); err != nil {
			return c, err
		}
	}
	return c, nil
}

// node is the Node message the client sends, as Envoy fills it.
func (c Config) node() *corev3.Node {
	n := &corev3.Node{Id: c.NodeID, Cluster: c.Cluster, UserAgentName: c.UserAgentName}
	if c.UserAgentVersion != "" {
		n.UserAgentVersionType = &corev3.Node_UserAgentVersion{UserAgentVersion: c.UserAgentVersion}
	}
	if c.Zone != "" {
		n.Locality = &corev3.Locality{Zone: c.Zone}
	}
	return n
}

// config builds the crypto/tls configuration from the files.
func (t TLS) config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pool, err := certpool.FromFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("adsclient: reading the CA file: %w", err)
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("adsclient: loading the client key pair: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// dialOptions are the options of one connection attempt.
func (c Config) dialOptions() ([]grpc.DialOption, error) {
	creds := insecure.NewCredentials()
	if c.TLS.enabled() {
		cfg, err := c.TLS.config()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithUserAgent(c.UserAgentName),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.MaxMessageBytes)),
	}
	if c.Keepalive > 0 {
		opts = append(opts, grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: c.Keepalive, Timeout: 10 * time.Second}))
	}
	return opts, nil
}
