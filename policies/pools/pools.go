// Package pools reads the pools file: the services, backends and session
// policy that `stickylb validate`, `plan`, `xds` and `xdp` share.
//
// The file is YAML (JSON works too: YAML 1.2 is a superset). It is parsed into
// a yaml.Node tree and walked by hand, so that every mistake in a file is
// reported in one pass, each with file:line:col, instead of the first one a
// struct decoder trips over. Unknown fields, duplicate keys, wrong types and
// out-of-range values are errors; docs/pools.md is the reference of every
// field. Anchors, aliases and merge keys (<<) are honoured.
//
// Defaults are applied in one place, applyDefaults; the Default* constants
// name every value it fills in.
package pools

import (
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/stickylb/stickylb/policies/balance"
	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/sessions"
)

// Service protocols. http and grpc are L7 (Caddy, Envoy, proxyless gRPC);
// tcp and udp are L4 (Envoy listeners and XDP VIPs).
const (
	ProtocolHTTP = "http"
	ProtocolGRPC = "grpc"
	ProtocolTCP  = "tcp"
	ProtocolUDP  = "udp"
)

// Affinity modes: what identifies a session.
const (
	ModeNone      = "none"
	ModeCookie    = "cookie"
	ModeAppCookie = "app_cookie"
	ModeURL       = "url"
	ModeHeader    = "header"
	ModeSourceIP  = "source_ip"
	ModeQUICCID   = "quic_cid"
)

// Balance algorithms: how a new session (or an unkeyed request) picks a
// backend, and how keyed modes map their key to one.
const (
	BalanceLeastConn  = "weighted_least_conn"
	BalanceRoundRobin = "weighted_round_robin"
	BalanceMaglev     = chash.AlgorithmMaglev
	BalanceRingHash   = chash.AlgorithmRingHash
)

// Application cookie modes.
const (
	// AppCookiePrefix prefixes the backend's cookie value with a sealed
	// identity (stateless, works across nodes).
	AppCookiePrefix = "prefix"
	// AppCookieLearn remembers value -> backend in a session table and hashes
	// values it has not seen.
	AppCookieLearn = "learn"
)

// URL key sources (URLKey.Source).
const (
	URLQuery       = "query"
	URLPathSegment = "path_segment"
	URLSuffix      = "suffix"
)

// Health check protocols.
const (
	HealthHTTP = "http"
	HealthTCP  = "tcp"
	HealthICMP = "icmp"
)

// Defaults filled in by applyDefaults when a field is omitted. Those every tier shares are
// defined once, in the package that implements them (sessions, chash, balance, health), and
// only named here.
const (
	DefaultTTL                = sessions.DefaultTTL
	DefaultMaxSessions        = sessions.DefaultMaxEntries
	DefaultCookieName         = "lb_session"
	DefaultCookiePath         = "/"
	DefaultAppCookieMode      = AppCookiePrefix
	DefaultWeight             = 1
	DefaultTableSize          = chash.DefaultMaglevTableSize
	DefaultMinRingSize        = chash.DefaultMinRingSize
	DefaultMaxRingSize        = chash.DefaultMaxRingSize
	DefaultCIDLength          = 8
	DefaultAggression         = balance.DefaultAggression
	DefaultMinWeightPercent   = balance.DefaultMinWeightPercent
	DefaultHealthInterval     = health.DefaultInterval
	DefaultHealthTimeout      = health.DefaultTimeout
	DefaultHealthPath         = health.DefaultPath
	DefaultHealthyThreshold   = health.DefaultHealthyThreshold
	DefaultUnhealthyThreshold = health.DefaultUnhealthyThreshold
	// Idle timeouts of the XDP connection table, as IPVS's: UDP 300 s, TCP 900 s.
	DefaultUDPIdleTimeout = 300 * time.Second
	DefaultTCPIdleTimeout = 900 * time.Second
)

// Limits checked by Parse.
const (
	// MaxWeight bounds backend weights (1..MaxWeight). Envoy accepts up to
	// 2^32-1, but Maglev and ring entries are shared in proportion to weight,
	// so a ratio above 10^4 leaves small backends with no entries at the
	// default sizes; weight 0 is rejected because a backend that should take
	// no new sessions says drain: true.
	MaxWeight = 10000
	// MaxTableSize is Envoy's largest Maglev table.
	MaxTableSize = 5000011
	// MaxVIPTableSize is the largest Maglev table of a vip service: the XDP forwarder's
	// (every tier must build the same table, so a larger one is an error, not a cap).
	MaxVIPTableSize = 65537
	// MaxRingSize is Envoy's largest ring (8M entries).
	MaxRingSize = chash.MaxRingSize
	// GRPCMaxRingSize is where grpc-go caps a ring by default.
	GRPCMaxRingSize = chash.GRPCRingSizeCap
	// MinCIDLength leaves room for the first byte and the 2-byte server id.
	MinCIDLength = 3
	// MaxCIDLength is QUIC v1's longest connection ID.
	MaxCIDLength = 20
	// MaxSessionsLimit bounds affinity.max_sessions.
	MaxSessionsLimit = 1 << 30
	// MaxFileSize is the largest pools file read; anything bigger is far more
	// likely a wrong path than a real fleet.
	MaxFileSize = 32 << 20
	// MaxNameLength bounds a service's name (a DNS label's length), MaxZoneLength a
	// zone's, MaxHashKeyLength a backend's hash_key (ValidName, ValidZone, ValidHashKey).
	// Views from the control plane are held to them too (fleetview), so a node never
	// takes a name the file could not hold.
	MaxNameLength    = 63
	MaxZoneLength    = 128
	MaxHashKeyLength = 255
)

// File is a parsed, validated pools file with every default filled in.
type File struct {
	// Filename is the name given to Parse (the path given to Load), so later
	// stages can report file:line against Service.Line and Backend.Line.
	Filename string
	Services []*Service
	// Warnings are legal settings that likely do not do what the operator
	// expects (for example gRPC clients ignoring endpoint weights). They never
	// make Parse fail.
	Warnings ErrorList
	// digest is the SHA-256 of the bytes parsed, so a Watcher knows this content.
	digest [sha256.Size]byte
}

// Service is one entry of services:.
type Service struct {
	Name     string
	Protocol string // ProtocolHTTP, ProtocolGRPC, ProtocolTCP, ProtocolUDP
	// Listen is the Envoy listener address as written ("ip:port"); empty
	// when the service has none (grpc, or a VIP-only tcp/udp service).
	Listen string
	// VIP is the XDP forwarder's "ip:port" as written (tcp and udp only).
	VIP string
	// IdleTimeout is how long the XDP forwarder's connection table keeps a flow of the
	// VIP that sends nothing (vip services only; defaults per protocol).
	IdleTimeout time.Duration
	Affinity    Affinity
	Balance     string // BalanceLeastConn, BalanceRoundRobin, BalanceMaglev, BalanceRingHash
	// Hash is zero unless Balance is maglev or ring_hash. TableSize is set
	// only for maglev; ring sizes are set for both (maglev falls back to the
	// ring where Maglev is missing, as in gRPC).
	Hash         Hash
	SlowStart    *SlowStart   // nil: no slow start
	HealthCheck  *HealthCheck // nil: no active health checking
	CrossZone    bool
	DrainedZones []string
	// Forwarding is how the XDP tier reaches the service's backends (vip services):
	// ForwardingAuto (the default), ForwardingDR or ForwardingNAT, which a backend may
	// override, or ForwardingTunnel, for all of them.
	Forwarding Forwarding
	// TunnelPort is the UDP port the tunnel's GUE packets go to (forwarding tunnel only:
	// DefaultTunnelPort; 0 otherwise).
	TunnelPort uint16
	// SecondChance: each row of the VIP's table names a secondary backend, carried in the
	// tunnel's header, to which a backend passes a packet of a connection it does not hold
	// (forwarding tunnel only: true unless turned off).
	SecondChance bool
	Backends     []*Backend
	// Line is where the service's mapping starts in the file.
	Line int
}

// Affinity says what identifies a session and how long it lives. Exactly
// the block that matches Mode is non-nil (Cookie for cookie, and so on).
type Affinity struct {
	Mode string
	// TTL is the session lifetime, refreshed on use (whole seconds, >= 1s).
	TTL time.Duration
	// MaxSessions bounds the session table of the tiers that keep one.
	MaxSessions int
	Cookie      *Cookie
	AppCookie   *AppCookie
	URL         *URLKey
	Header      *HeaderKey
	QUICCID     *QUICCID
}

// Keyed reports whether the mode maps a client-supplied key to a backend by
// hashing it with Balance (so Balance must be maglev or ring_hash).
func (a *Affinity) Keyed() bool {
	switch a.Mode {
	case ModeURL, ModeHeader, ModeSourceIP, ModeQUICCID:
		return true
	case ModeAppCookie:
		return a.AppCookie != nil && a.AppCookie.Mode == AppCookieLearn
	}
	return false
}

// Cookie is the LB cookie of mode cookie.
type Cookie struct {
	Name string
	Path string
}

// AppCookie names the application's own session cookie.
type AppCookie struct {
	Name string
	Mode string // AppCookiePrefix or AppCookieLearn
}

// URLKey says which part of the URL carries the session key.
type URLKey struct {
	Source string // URLQuery, URLPathSegment or URLSuffix
	// Query is the query parameter name (Source == URLQuery).
	Query string
	// PathSegment is 0-based; negative counts from the end (Source == URLPathSegment).
	PathSegment int
	// Suffix is the marker such as ";jsessionid=" (Source == URLSuffix).
	Suffix string
}

// HeaderKey names the request header that carries the session key.
type HeaderKey struct {
	Name string
}

// QUICCID configures QUIC connection-ID routing on a UDP VIP.
type QUICCID struct {
	// CIDLength is the length of the server-chosen connection IDs.
	CIDLength int
}

// Hash configures the consistent hashes.
type Hash struct {
	TableSize   uint64 // Maglev table size, prime
	MinRingSize uint64
	MaxRingSize uint64
	// VirtualNodes, when not 0 (ring_hash only), gives every backend VirtualNodes x weight /
	// the service's smallest weight ([Service.MinWeight]) ring points, so a backend keeps its
	// points while others come and go. The ring sizes are then set from the current backends
	// (chash.VirtualNodesRingSize) and MinRingSize/MaxRingSize, left at their defaults, are
	// not used.
	VirtualNodes uint64
	// BoundedLoad is Envoy's hash_balance_factor in percent: 0 is off,
	// otherwise >= 100 (125 lets a host take 1.25x the average load).
	BoundedLoad uint32
}

// SlowStart ramps a new backend's weight up as Envoy's slow_start_config does.
type SlowStart struct {
	Window           time.Duration
	Aggression       float64
	MinWeightPercent float64
}

// HealthCheck configures active probing of the backends.
type HealthCheck struct {
	Protocol string // HealthHTTP, HealthTCP, HealthICMP
	Path     string // http only
	// ExpectStatus lists accepted HTTP statuses; nil means 200-399.
	ExpectStatus       []int
	Port               int // 0: the backend's own port
	Interval           time.Duration
	Timeout            time.Duration
	HealthyThreshold   int
	UnhealthyThreshold int
}

// Backend is one entry of a service's backends:.
type Backend struct {
	Address  string // "ip:port" as written
	Weight   uint32
	Zone     string
	HashKey  string
	ServerID uint16 // 0: none
	MAC      string // as written; VIP services only
	Drain    bool
	// Forwarding overrides the service's forwarding for this backend ("" keeps it).
	Forwarding Forwarding
	// Line is where the backend's mapping starts in the file.
	Line int
}

// Identity is what sealed cookies carry and what the consistent hashes hash:
// the hash_key when set, else the address as written.
func (b *Backend) Identity() string {
	if b.HashKey != "" {
		return b.HashKey
	}
	return b.Address
}

// AddrPort is the parsed Address. Parse guarantees it is valid.
func (b *Backend) AddrPort() netip.AddrPort {
	ap, _ := netip.ParseAddrPort(b.Address)
	return ap
}

// HardwareAddr is the parsed MAC, nil when none was given (the XDP loader
// then resolves it from the neighbour table).
func (b *Backend) HardwareAddr() net.HardwareAddr {
	if b.MAC == "" {
		return nil
	}
	hw, _ := net.ParseMAC(b.MAC)
	return hw
}

// Forwarding is how the XDP tier sends a VIP's packets to a backend.
type Forwarding string

// Forwarding modes.
const (
	// ForwardingAuto: direct routing when the backend is on a subnet of the LB's interface
	// and listens on the VIP's port, NAT otherwise (decided by the loader, which knows the
	// interface's subnets).
	ForwardingAuto Forwarding = "auto"
	// ForwardingDR: direct routing; the backend holds the VIP and listens on its port.
	ForwardingDR Forwarding = "dr"
	// ForwardingNAT: destination and source rewritten; replies return through the LB.
	ForwardingNAT Forwarding = "nat"
	// ForwardingTunnel: the client's packet encapsulated in GUE to the backend, which
	// decapsulates it (`stickylb backend`) and replies directly; a service's, for all its
	// backends. auto never picks it.
	ForwardingTunnel Forwarding = "tunnel"
)

// DefaultTunnelPort is the UDP port of the GUE tunnel of forwarding tunnel (tunnel_port).
const DefaultTunnelPort = 6080

// Known reports whether f is one of the forwarding modes ("" is not: it means "not
// written", which a backend inherits and a service reads as auto).
func (f Forwarding) Known() bool {
	return f == ForwardingAuto || f == ForwardingDR || f == ForwardingNAT || f == ForwardingTunnel
}

// ForwardingOf is backend b's forwarding: tunnel for every backend of a tunnel service,
// else its own, else the service's, else auto; auto becomes NAT when b's port differs from
// the VIP's (direct routing keeps the port), and is left to the loader otherwise.
func (s *Service) ForwardingOf(b *Backend) Forwarding {
	if s.Forwarding == ForwardingTunnel {
		return ForwardingTunnel
	}
	f := b.Forwarding
	if f == "" {
		f = s.Forwarding
	}
	if f == "" {
		f = ForwardingAuto
	}
	if vip, ok := s.VIPAddrPort(); ok && f == ForwardingAuto && b.AddrPort().Port() != vip.Port() {
		return ForwardingNAT
	}
	return f
}

// VIPAddrPort is the parsed VIP; ok is false when the service has none.
func (s *Service) VIPAddrPort() (ap netip.AddrPort, ok bool) {
	ap, err := netip.ParseAddrPort(s.VIP)
	return ap, err == nil
}

// ListenAddrPort is the parsed Listen; ok is false when the service has none.
func (s *Service) ListenAddrPort() (ap netip.AddrPort, ok bool) {
	ap, err := netip.ParseAddrPort(s.Listen)
	return ap, err == nil
}

// ZoneDrained reports whether zone is listed in DrainedZones.
func (s *Service) ZoneDrained(zone string) bool {
	for _, z := range s.DrainedZones {
		if z == zone {
			return true
		}
	}
	return false
}

// Service returns the service called name, or nil.
func (f *File) Service(name string) *Service {
	for _, s := range f.Services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// Load reads (ReadFile: at most MaxFileSize bytes) and parses the pools file at path. A
// non-nil error is always an ErrorList; an unreadable file gives one entry that wraps the
// I/O error.
func Load(path string) (*File, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse parses and validates a pools file. filename is used in messages.
// On failure the File is nil and the error is an ErrorList holding every
// problem found, sorted by position.
func Parse(filename string, data []byte) (*File, error) {
	if len(data) > MaxFileSize {
		return nil, ErrorList{{File: filename, Msg: fmt.Sprintf("pools file is %d bytes; the limit is %d", len(data), MaxFileSize)}}
	}
	d := newDecoder(filename)
	f := d.parse(data)
	if len(d.errs) > 0 {
		return nil, d.errs.normalize()
	}
	f.Filename = filename
	f.Warnings = d.warns.normalize()
	f.digest = sha256.Sum256(data)
	return f, nil
}
