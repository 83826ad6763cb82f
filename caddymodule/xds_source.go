package caddymodule

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/adsclient"
	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/policies/zones"
)

func init() {
	caddy.RegisterModule(new(XDSUpstreams))
}

// XDSUpstreams is the upstream source http.reverse_proxy.upstreams.stickylb_xds: the
// backends of one service as the control plane (`stickylb xds`) publishes them, with its
// health verdicts, so every Caddy node routes on the same view and runs no probes of its
// own. Weights and drain states reach the stickylb policies by upstream identity
// (weighted_least_conn and the keyed policies' hash tables weigh by them, so the tables are
// Envoy's and gRPC's; a draining upstream gets no new session, while a session pinned to it
// keeps it).
//
// Every source naming one control plane and node shares one ADS subscription, kept across
// config reloads. The last view applied is saved in Caddy's data directory and served at
// start until the control plane answers, so a Caddy restarted during a control-plane
// outage serves what it last knew.
type XDSUpstreams struct {
	// Server is the control plane's host:port.
	Server string `json:"server,omitempty"`
	// Servers are the control plane's replicas, tried in order (after Server when both are
	// set): the source stays on one while its stream lasts and tries the next at once when
	// it fails or is refused.
	Servers []string `json:"servers,omitempty"`
	// Service names the pools file's service whose backends this source returns.
	Service string `json:"service,omitempty"`
	// NodeID is this node's id at the control plane (default HOST/caddy).
	NodeID string `json:"node_id,omitempty"`
	// Zone is this node's zone: a service with cross_zone false is served from it first.
	Zone string `json:"zone,omitempty"`
	// CA, Cert and Key are PEM files: CA verifies the control plane (TLS), Cert and Key
	// are this node's client certificate (mTLS).
	CA   string `json:"ca,omitempty"`
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	// AllowLoopback admits backends on loopback addresses, for demos and tests on one host.
	// Without it they are left out, as link-local and unspecified addresses always are,
	// and this Caddy's own listeners (its admin API first) are left out either way.
	AllowLoopback bool `json:"allow_loopback,omitempty"`
	// MaxMessageSize bounds one response from the control plane, in bytes (default 16 MiB:
	// about 90,000 endpoints, at 180 bytes each with their metadata): a larger one ends
	// the stream before it is read.
	MaxMessageSize int `json:"max_message_size,omitempty"`

	sub    *xdsSub
	subKey string
	// picks caches the dial addresses of the current view for this service and zone.
	picks atomic.Pointer[xdsPick]
}

// xdsPick is what GetUpstreams returns for one view.
type xdsPick struct {
	view  *xdsView
	dials []string
}

// CaddyModule returns the Caddy module information.
func (*XDSUpstreams) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.upstreams.stickylb_xds",
		New: func() caddy.Module { return new(XDSUpstreams) },
	}
}

// subPool holds the ADS subscriptions by subscription key (*xdsSub).
var subPool = caddy.NewUsagePool()

// Provision joins (or starts) the subscription of this server and node.
func (x *XDSUpstreams) Provision(ctx caddy.Context) error {
	if x.NodeID == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("stickylb_xds: node_id not given and no host name: %w", err)
		}
		x.NodeID = host + "/caddy"
	}
	if x.MaxMessageSize == 0 {
		x.MaxMessageSize = defaultXDSMaxMessage
	}
	cfg := adsclient.Config{Server: x.Server, Servers: x.Servers, NodeID: x.NodeID, Zone: x.Zone, MaxMessageBytes: x.MaxMessageSize,
		UserAgentName: fleetview.UserAgentCaddy, TLS: adsclient.TLS{CAFile: x.CA, CertFile: x.Cert, KeyFile: x.Key}}
	// The key holds everything the connection depends on: a reload that changes the zone,
	// the TLS files or the message bound starts a new subscription, one that changes
	// nothing keeps the old one.
	servers := x.servers()
	x.subKey = fmt.Sprintf("%s|%s|%s|%s|%s|%s|%d", servers, cfg.NodeID, cfg.Zone, x.CA, x.Cert, x.Key, cfg.MaxMessageBytes)
	v, _, err := subPool.LoadOrNew(x.subKey, func() (caddy.Destructor, error) {
		return startXDSSub(cfg, x.subKey, filepath.Join(caddy.AppDataDir(), "stickylb", "xds", viewFileName(servers, cfg.NodeID)),
			caddy.Log().Named("stickylb_xds"))
	})
	if err != nil {
		return fmt.Errorf("stickylb_xds: %w", err)
	}
	x.sub = v.(*xdsSub)
	// One collector per subscription, registered in each config's registry (Caddy gives
	// every config its own); a second registration in one registry is expected.
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := reg.Register(x.sub.collector); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				ctx.Logger().Error("registering the xDS client's metrics", zap.Error(err))
			}
		}
	}
	return nil
}

// servers is every control-plane address of the source, comma-separated: the
// subscription's key, the saved view's name and the logs' label.
func (x *XDSUpstreams) servers() string {
	return serversOf(adsclient.Config{Server: x.Server, Servers: x.Servers})
}

// serversOf is a client configuration's addresses, Server first, comma-separated.
func serversOf(cfg adsclient.Config) string {
	all := cfg.Servers
	if cfg.Server != "" {
		all = append([]string{cfg.Server}, all...)
	}
	return strings.Join(all, ",")
}

// Validate checks the settings.
func (x *XDSUpstreams) Validate() error {
	if x.servers() == "" || x.Service == "" {
		return errors.New("stickylb_xds: server and service are required")
	}
	if (x.Cert == "") != (x.Key == "") {
		return errors.New("stickylb_xds: cert and key go together")
	}
	if x.MaxMessageSize < 0 {
		return errors.New("stickylb_xds: max_message_size must be positive")
	}
	return nil
}

// Cleanup drops this source's reference to the subscription.
func (x *XDSUpstreams) Cleanup() error {
	if x.sub != nil {
		_, _ = subPool.Delete(x.subKey)
	}
	return nil
}

// GetUpstreams returns the service's upstreams in the last view applied, as new values on
// every call (Caddy writes into each *Upstream it gets). It reads memory only: the
// subscription updates the view in the background.
func (x *XDSUpstreams) GetUpstreams(*http.Request) ([]*reverseproxy.Upstream, error) {
	v := x.sub.view.Load()
	if v == nil {
		return nil, fmt.Errorf("stickylb_xds: no view of %s from %s yet", x.Service, x.servers())
	}
	p := x.picks.Load()
	if p == nil || p.view != v {
		svc := v.Services[x.Service]
		if svc == nil {
			return nil, fmt.Errorf("stickylb_xds: service %q is not in the view from %s (an http or grpc service of the pools file)", x.Service, x.servers())
		}
		p = &xdsPick{view: v, dials: x.admitted(x.Service, svc).pick(x.Zone)}
		x.picks.Store(p)
	}
	// One backing array for the values: two allocations per call whatever the pool's size.
	vals := make([]reverseproxy.Upstream, len(p.dials))
	out := make([]*reverseproxy.Upstream, len(p.dials))
	for i, d := range p.dials {
		vals[i].Dial = d
		out[i] = &vals[i]
	}
	return out, nil
}

// UnmarshalCaddyfile reads
//
//	dynamic stickylb_xds {
//		server  ADDR [ADDR...]
//		service NAME
//		node_id ID
//		zone    Z
//		ca      FILE
//		cert    FILE
//		key     FILE
//		allow_loopback
//		max_message_size SIZE
//	}
//
// SIZE is a number of bytes, or one with a unit: 16MiB, 512KiB, 20MB.
func (x *XDSUpstreams) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the source's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		var dst *string
		switch d.Val() {
		case "allow_loopback":
			if d.NextArg() {
				return d.ArgErr()
			}
			x.AllowLoopback = true
			continue
		case "max_message_size":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := parseByteSize(d.Val())
			if err != nil {
				return d.Errf("stickylb_xds: max_message_size: %v", err)
			}
			x.MaxMessageSize = n
			if d.NextArg() {
				return d.ArgErr()
			}
			continue
		case "server":
			// One address, or a replica set: every one is tried in order.
			x.Servers = append(x.Servers, d.RemainingArgs()...)
			if len(x.Servers) == 0 {
				return d.ArgErr()
			}
			continue
		case "service":
			dst = &x.Service
		case "node_id":
			dst = &x.NodeID
		case "zone":
			dst = &x.Zone
		case "ca":
			dst = &x.CA
		case "cert":
			dst = &x.Cert
		case "key":
			dst = &x.Key
		default:
			return d.Errf("stickylb_xds: unknown option %q", d.Val())
		}
		if !d.NextArg() {
			return d.ArgErr()
		}
		*dst = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	return nil
}

// The view as a Caddy node keeps it (and saves it).

// xdsView is the applied view: the services by name.
type xdsView struct {
	Services map[string]*xdsService `json:"services"`
}

// xdsService is one service of the view.
type xdsService struct {
	CrossZone bool         `json:"cross_zone"`
	Backends  []xdsBackend `json:"backends"`
}

// xdsBackend is one backend with the control plane's verdict.
type xdsBackend struct {
	// ID is the backend's identity (hash_key or address); Dial is its address.
	ID     string `json:"id"`
	Dial   string `json:"dial"`
	Weight uint32 `json:"weight"`
	Zone   string `json:"zone,omitempty"`
	// Drain: no new session; the backend's own drain, or its drained zone's while
	// another zone has a usable backend (see drainZones).
	Drain  bool      `json:"drain,omitempty"`
	Health string    `json:"health"`
	Since  time.Time `json:"since,omitempty"`
}

// usable: the control plane did not find it down (unknown counts: a backend not probed yet,
// or one the control plane fails open to, is routed to, as Envoy does).
func (b *xdsBackend) usable() bool { return b.Health != health.Unhealthy.String() }

// pick returns the dial addresses a node of zone serves: the backends the zone rule sends
// its new sessions to (zones.Eligible's Local: its own zone first with cross_zone false,
// failing open to the down ones when none is healthy), and the usable draining ones of the
// same zones, whose pinned sessions stay (the drain table keeps new ones away). The drained
// zones are already folded into each backend's Drain (drainZones).
func (s *xdsService) pick(zone string) []string {
	e := zones.Eligible(zone, s.zoneBackends(), zones.Policy{CrossZone: s.CrossZone})
	local := make([]bool, len(s.Backends))
	for _, i := range e.Local {
		local[i] = true
	}
	var out []string
	for i := range s.Backends {
		b := &s.Backends[i]
		if local[i] || b.Drain && b.usable() && (!e.OwnZone || b.Zone == zone) {
			out = append(out, b.Dial)
		}
	}
	return out
}

// zoneBackends is the service's backends as the zone rule sees them.
func (s *xdsService) zoneBackends() []zones.Backend {
	bs := make([]zones.Backend, len(s.Backends))
	for i, b := range s.Backends {
		bs[i] = zones.Backend{ID: b.ID, Zone: b.Zone, Weight: float64(b.Weight), Healthy: b.usable(), Drain: b.Drain}
	}
	return bs
}

// routableView converts a decoded view into the one a Caddy node routes on, refusing what
// it cannot route to.
func routableView(v *fleetview.View) (*xdsView, error) {
	out := &xdsView{Services: map[string]*xdsService{}}
	for _, s := range v.File.Services {
		svc := &xdsService{CrossZone: s.CrossZone}
		dials := map[string]bool{}
		for _, b := range s.Backends {
			if dials[b.Address] {
				return nil, fmt.Errorf("service %s: address %s listed twice (Caddy keys upstreams by address)", s.Name, b.Address)
			}
			dials[b.Address] = true
			vd := v.Verdicts[fleetview.Key(s.Name, b.Identity())]
			svc.Backends = append(svc.Backends, xdsBackend{ID: b.Identity(), Dial: b.Address, Weight: b.Weight,
				Zone: b.Zone, Drain: b.Drain, Health: vd.State.String(), Since: vd.Since})
		}
		drainZones(s, svc)
		out.Services[s.Name] = svc
	}
	return out, nil
}

// drainZones drains the backends of s's drained zones unless they are the last resort
// (zones.Eligibility.LastResort: no other zone has a usable backend that does not drain
// itself), as on the other tiers. The verdicts come with each view, so deciding here holds
// until the next one. The decoded Drain of a backend in a drained zone is its own
// (backend_drain).
func drainZones(s *pools.Service, svc *xdsService) {
	if len(s.DrainedZones) == 0 {
		return
	}
	if zones.Eligible("", svc.zoneBackends(), zones.Policy{CrossZone: s.CrossZone, DrainedZones: s.DrainedZones}).LastResort {
		return
	}
	for i := range svc.Backends {
		if b := &svc.Backends[i]; s.ZoneDrained(b.Zone) {
			b.Drain = true
		}
	}
}

// xdsSub is one ADS subscription shared by every source naming its server and node.
type xdsSub struct {
	client    *adsclient.Client
	collector prometheus.Collector
	cancel    context.CancelFunc
	log       *zap.Logger
	// path is where the last applied view is saved.
	path         string
	server, node string
	// key names this subscription's view in xdsTable.
	key  string
	view atomic.Pointer[xdsView]
	// refusals are the backends of the view its sources leave out (logged once each).
	refusals fleetview.Refusals
	// asm joins the view's halves; it knows which services wait for their endpoints.
	asm *fleetview.Assembler

	pacedOnce sync.Once
	pacing    xdsPacing
}

// viewFileName names the saved view of a server and node.
func viewFileName(server, node string) string {
	h := sha256.Sum256([]byte(server + "\x00" + node))
	return "view-" + hex.EncodeToString(h[:8]) + ".json"
}

// savedView is the file format of a saved view.
type savedView struct {
	Server string    `json:"server"`
	NodeID string    `json:"node_id"`
	Saved  time.Time `json:"saved"`
	View   *xdsView  `json:"view"`
}

func startXDSSub(cfg adsclient.Config, key, path string, log *zap.Logger) (*xdsSub, error) {
	servers := serversOf(cfg)
	// The client names the server and the node on its lines itself: it gets log as is.
	c, err := adsclient.New(cfg, log)
	if err != nil {
		return nil, err
	}
	log = log.With(zap.String("xds_server", servers), zap.String("node", cfg.NodeID))
	if cfg.TLS.CAFile == "" && cfg.TLS.CertFile == "" && cfg.TLS.KeyFile == "" {
		log.Warn("the stream to the control plane has no TLS: whoever can reach it, or the path to it, can feed this node backends; set ca (and cert, key)")
	}
	s := &xdsSub{client: c, collector: c.Collector(), log: log, path: path,
		server: servers, node: cfg.NodeID, key: key}
	s.load(cfg)
	a := &fleetview.Assembler{Decode: fleetview.DecodeCaddy, Apply: s.apply, Waited: s.waited}
	s.asm = a
	if err := c.Subscribe(resource.ClusterType, a.Clusters); err != nil {
		return nil, err
	}
	if err := c.Subscribe(resource.EndpointType, a.Endpoints); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if err := c.Start(ctx); err != nil {
		cancel()
		return nil, err
	}
	return s, nil
}

// load serves the saved view until the control plane sends one.
func (s *xdsSub) load(cfg adsclient.Config) {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	var sv savedView
	if err == nil {
		err = json.Unmarshal(b, &sv)
	}
	if err == nil && (sv.View == nil || sv.Server != serversOf(cfg) || sv.NodeID != cfg.NodeID) {
		err = errors.New("not a view of this server and node")
	}
	if err != nil {
		s.log.Warn("ignoring the saved xDS view", zap.String("file", s.path), zap.Error(err))
		return
	}
	s.install(sv.View)
	s.log.Info("serving the saved xDS view until the control plane answers", zap.String("file", s.path),
		zap.Time("saved", sv.Saved))
}

// apply installs a complete view from the control plane; an error NACKs it and the last
// view stays.
func (s *xdsSub) apply(v *fleetview.View) error {
	xv, err := routableView(v)
	if err != nil {
		return err
	}
	s.install(xv)
	s.save(xv)
	// A refusal whose backend left the view is forgotten: if it comes back, it is logged again.
	s.refusals.Keep(func(r fleetview.Refused) bool {
		svc := xv.Services[r.Service]
		return svc != nil && slices.ContainsFunc(svc.Backends, func(b xdsBackend) bool { return b.Dial == r.Address })
	})
	s.paced().applied.Info("applied an xDS view", zap.Int("services", len(xv.Services)))
	return nil
}

func (s *xdsSub) install(v *xdsView) {
	s.view.Store(v)
	xdsTable.set(s.key, v)
}

// save writes the view to the file, at once or, within a second of the last write, when
// the second is over (the latest view then): see paced.
func (s *xdsSub) save(v *xdsView) { s.paced().saves.Put(v) }

// write writes the view atomically (a temporary file renamed); a failure is logged, not
// NACKed: the view itself is fine.
func (s *xdsSub) write(v *xdsView) {
	b, err := json.Marshal(savedView{Server: s.server, NodeID: s.node, Saved: time.Now().UTC(), View: v})
	if err == nil {
		err = os.MkdirAll(filepath.Dir(s.path), 0o700)
	}
	if err == nil {
		tmp := s.path + ".tmp"
		if err = os.WriteFile(tmp, b, 0o600); err == nil {
			err = os.Rename(tmp, s.path)
		}
	}
	if err != nil {
		s.log.Warn("saving the xDS view", zap.String("file", s.path), zap.Error(err))
	}
}

// Destruct stops the subscription when no config uses it; the last view applied is on
// disk when it returns.
func (s *xdsSub) Destruct() error {
	s.cancel()
	err := s.client.Close()
	p := s.paced()
	p.saves.Stop()
	p.applied.Stop()
	xdsTable.set(s.key, nil)
	return err
}

// xdsTable is the control plane's weights and drain states by upstream identity, as the
// subscriptions' views give them: the stickylb policies consult it (weights) and the drain
// set (drains). Process-wide like the drain set, as the policies and sources of one config
// are separate modules.
var xdsTable = newSourceTable()

// sourceTable merges the views of every subscription.
type sourceTable struct {
	mu    sync.Mutex
	views map[string]*xdsView
	// weights is the merged weight table, nil when no view names an upstream. A new value
	// is stored only when the weights or units change, so a hash table built over it stays
	// current while its pointer does (one atomic load per pick).
	weights atomic.Pointer[weightTable]
}

// weightTable is the control plane's weights by upstream identity, immutable once published.
type weightTable struct {
	weight map[string]uint32
	// unit is the weight unit of hash virtual_nodes for the identity: the smallest weight
	// among its service's backends in the pools file (unhealthy and draining ones included),
	// as the xDS tier sizes Envoy's and gRPC's rings with it, so a backend keeps its points
	// when the lightest one turns unhealthy.
	unit map[string]uint32
}

func newSourceTable() *sourceTable { return &sourceTable{views: map[string]*xdsView{}} }

// set replaces the view of subscription key (nil removes it) and republishes the merged
// weights and drain states. The policies know an upstream by address only, so one named by
// several services or views is drained if any of them drains it, weighs the largest
// weight any of them gives and takes the smallest unit (a unit is then never above the
// weight; every choice is deterministic, map order is not).
func (t *sourceTable) set(key string, v *xdsView) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if v == nil {
		delete(t.views, key)
	} else {
		t.views[key] = v
	}
	wt := &weightTable{weight: map[string]uint32{}, unit: map[string]uint32{}}
	drained := map[string]bool{}
	for _, v := range t.views {
		for _, s := range v.Services {
			unit := s.weightUnit()
			for _, b := range s.Backends {
				if b.Weight == 0 {
					continue // a view decodes 0 as the default; a saved one may not
				}
				wt.weight[b.Dial] = max(wt.weight[b.Dial], b.Weight)
				if u, ok := wt.unit[b.Dial]; !ok || unit < u {
					wt.unit[b.Dial] = unit
				}
				if b.Drain {
					drained[b.Dial] = true
				}
			}
		}
	}
	switch old := t.weights.Load(); {
	case len(wt.weight) == 0:
		t.weights.Store(nil)
	case old == nil || !maps.Equal(old.weight, wt.weight) || !maps.Equal(old.unit, wt.unit):
		t.weights.Store(wt)
	}
	drains.setSource(drained)
}

// weightUnit is the weight unit of the service's hash virtual nodes: the pools file's
// smallest weight (pools.Service.MinWeight; the view lists every backend of the file,
// whatever its health), 0 when none has one.
func (s *xdsService) weightUnit() uint32 {
	ps := pools.Service{Backends: make([]*pools.Backend, len(s.Backends))}
	for i, b := range s.Backends {
		ps.Backends[i] = &pools.Backend{Weight: b.Weight}
	}
	return ps.MinWeight()
}

// weight is the control plane's weight of the upstream with identity id.
func (t *sourceTable) weight(id string) (float64, bool) {
	w, _, ok := t.weights.Load().lookup(id)
	return float64(w), ok
}

func (t *sourceTable) hasWeights() bool { return t.weights.Load() != nil }

// current is the weight table now published (nil: none).
func (t *sourceTable) current() *weightTable { return t.weights.Load() }

// lookup returns the weight and the virtual-node unit of identity id, ok false when the
// control plane does not name it (or wt is nil).
func (wt *weightTable) lookup(id string) (weight, unit uint32, ok bool) {
	if wt == nil {
		return 0, 0, false
	}
	w, ok := wt.weight[id]
	if !ok {
		return 0, 0, false
	}
	return w, wt.unit[id], true
}

// Interface guards
var (
	_ caddy.Provisioner           = (*XDSUpstreams)(nil)
	_ caddy.Validator             = (*XDSUpstreams)(nil)
	_ caddy.CleanerUpper          = (*XDSUpstreams)(nil)
	_ reverseproxy.UpstreamSource = (*XDSUpstreams)(nil)
	_ caddyfile.Unmarshaler       = (*XDSUpstreams)(nil)
)
