package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/stickylb/stickylb/internal/certpool"
	"github.com/stickylb/stickylb/internal/healthlog"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds"
)

type xdsOptions struct {
	pools, listen, admin      string
	tlsCert, tlsKey, clientCA string
	poll                      time.Duration
	maxNodes                  int
}

func xdsCmd(args []string, stderr io.Writer) int {
	fs := newFlagSet("xds", xdsUsage, stderr)
	var o xdsOptions
	fs.StringVar(&o.pools, "pools", "", "pools file to serve (reloaded when it changes)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:18000", "gRPC address for ADS and the per-type xDS services")
	fs.StringVar(&o.admin, "admin", "", "HTTP address for the status page at / (status.json beside it), /healthz, /metrics and /config (off when empty; unauthenticated: keep it private)")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "server certificate (PEM) for TLS")
	fs.StringVar(&o.tlsKey, "tls-key", "", "server key (PEM)")
	fs.StringVar(&o.clientCA, "client-ca", "", "CA bundle (PEM): require client certificates signed by it (mTLS)")
	fs.DurationVar(&o.poll, "poll", time.Second, "how often to look for pools-file changes")
	fs.IntVar(&o.maxNodes, "max-nodes", xds.DefaultMaxNodes, "node ids that may hold streams at once; beyond it a new node is refused (ResourceExhausted)")
	if err := fs.Parse(args); err != nil {
		return parseError(err)
	}
	if o.pools == "" || fs.NArg() != 0 {
		fmt.Fprint(stderr, xdsUsage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, err := newLogger()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer log.Sync()
	return serveXDS(ctx, o, log, stderr, nil)
}

// serveXDS runs the control plane until ctx ends. ready, when set, receives the bound
// addresses (tests listen on port 0).
func serveXDS(ctx context.Context, o xdsOptions, log *zap.Logger, stderr io.Writer, ready func(grpcAddr, adminAddr string)) int {
	f, ok := load(o.pools, stderr)
	if !ok {
		return 1
	}
	var opts []grpc.ServerOption
	useTLS := o.tlsCert != "" || o.tlsKey != "" || o.clientCA != ""
	if useTLS {
		creds, err := serverTLS(o)
		if err != nil {
			fmt.Fprintf(stderr, "stickylb xds: %v\n", err)
			return 1
		}
		opts = append(opts, grpc.Creds(creds))
	}
	opts = append(opts, grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Find streams whose node vanished without closing them within a minute: until
		// then their node id is taken (a reconnect from another address or certificate is
		// refused) and their state is kept.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 20 * time.Second}))
	var s *xds.Server
	hlog := healthlog.New(log)
	services := pools.HealthServices(f.Services)
	first := newFirstVerdicts(services)
	mon := health.NewMonitor(func(service string, tr health.Transition) {
		hlog.Transition(service, tr)
		first.decided(service, tr.ID)
		s.Stats.HealthTransitions.Add(1)
		s.RecordTransition(service, tr)
		if err := s.Refresh(); err != nil {
			log.Error("publishing health", zap.Error(err))
		}
	})
	defer mon.Stop()
	xopts := []xds.Option{xds.WithMaxNodes(o.maxNodes), xds.WithFirstVerdicts(first.ready), xds.WithProbes(mon.Lookup)}
	if o.clientCA != "" {
		// mTLS: a node id speaks only for the certificate that covers it.
		xopts = append(xopts, xds.WithNodeIdentity())
	}
	s = xds.NewServer(ctx, f, func(svc string, b *pools.Backend) health.State { return mon.View(svc, b.Identity()) }, log, xopts...)
	if err := mon.Apply(ctx, services); err != nil {
		fmt.Fprintf(stderr, "stickylb xds: %v\n", err)
		return 1
	}
	// The probes have started: every target is decided within the longest bound.
	stopHold := time.AfterFunc(first.bound, first.release)
	defer stopHold.Stop()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xds: listening for xDS: %v\n", err)
		return 1
	}
	g := grpc.NewServer(opts...)
	s.Register(g)
	go func() { _ = g.Serve(ln) }()
	defer g.GracefulStop()
	adminAddr := ""
	if o.admin != "" {
		aln, err := net.Listen("tcp", o.admin)
		if err != nil {
			fmt.Fprintf(stderr, "stickylb xds: listening for admin: %v\n", err)
			return 1
		}
		adminAddr = aln.Addr().String()
		hs := &http.Server{Handler: s.AdminHandler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = hs.Serve(aln) }()
		defer hs.Close()
	}
	go xds.Watch(ctx, o.pools, o.poll, s, log, func(nf *pools.File) {
		if err := mon.Apply(ctx, pools.HealthServices(nf.Services)); err != nil {
			log.Error("retargeting health checks", zap.Error(err))
		}
	})
	log.Info("serving xDS", zap.String("listen", ln.Addr().String()), zap.String("admin", adminAddr),
		zap.String("pools", o.pools), zap.Int("services", len(f.Services)), zap.Bool("tls", useTLS))
	if ready != nil {
		ready(ln.Addr().String(), adminAddr)
	}
	<-ctx.Done()
	return 0
}

// firstVerdictSlack is added to the health checks' first-verdict bound before the control
// plane publishes without every first verdict: a probe's timer and the transition's
// delivery run late on a loaded machine, and a target left unknown after it is published
// unknown (routable).
const firstVerdictSlack = 250 * time.Millisecond

// firstVerdicts closes ready once every target checked at start has a verdict (its first
// transition), or at bound: a target whose first probe hit a prober fault makes no
// transition, and stays unknown.
type firstVerdicts struct {
	ready chan struct{}
	bound time.Duration
	once  sync.Once

	mu      sync.Mutex
	pending map[string]bool // service + "\x00" + target id
}

func newFirstVerdicts(services []health.Service) *firstVerdicts {
	w := &firstVerdicts{ready: make(chan struct{}), pending: map[string]bool{}}
	for _, s := range services {
		w.bound = max(w.bound, s.Config.FirstVerdictWithin()+firstVerdictSlack)
		for _, t := range s.Targets {
			w.pending[s.Name+"\x00"+t.ID] = true
		}
	}
	if len(w.pending) == 0 {
		w.release()
	}
	return w
}

// decided notes a transition of id; the last pending one releases.
func (w *firstVerdicts) decided(service, id string) {
	w.mu.Lock()
	delete(w.pending, service+"\x00"+id)
	n := len(w.pending)
	w.mu.Unlock()
	if n == 0 {
		w.release()
	}
}

func (w *firstVerdicts) release() { w.once.Do(func() { close(w.ready) }) }

func serverTLS(o xdsOptions) (credentials.TransportCredentials, error) {
	if o.tlsCert == "" || o.tlsKey == "" {
		return nil, errors.New("--tls-cert and --tls-key go together (and --client-ca needs them)")
	}
	cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
	if err != nil {
		return nil, fmt.Errorf("loading the TLS key pair: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if o.clientCA != "" {
		pool, err := certpool.FromFile(o.clientCA)
		if err != nil {
			return nil, fmt.Errorf("reading the client CA: %w", err)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return credentials.NewTLS(cfg), nil
}
