package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/stickylb/stickylb/internal/certpool"
	"github.com/stickylb/stickylb/internal/healthlog"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds"
)

func xdsCmd(args []string, stderr io.Writer) int {
	o, err := parseXDSFlags(args, stderr)
	if err != nil {
		return parseError(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, err := newLogger()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer log.Sync()
	if o.replicated() {
		return serveReplica(ctx, o, log, stderr, nil)
	}
	return serveXDS(ctx, o, log, stderr, nil)
}

// serveXDS runs the control plane until ctx ends. ready, when set, receives the bound
// addresses (tests listen on port 0).
func serveXDS(ctx context.Context, o xdsOptions, log *zap.Logger, stderr io.Writer, ready func(grpcAddr, adminAddr string)) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "stickylb xds: %v\n", err)
		return 1
	}
	f, ok := load(o.pools, stderr)
	if !ok {
		return 1
	}
	gopts, err := grpcOptions(o)
	if err != nil {
		return fail(err)
	}
	cp, err := startControlPlane(ctx, f, o, log)
	if err != nil {
		return fail(err)
	}
	defer cp.stop()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fail(fmt.Errorf("listening for xDS: %w", err))
	}
	g := grpc.NewServer(append(gopts, cp.srv.GRPCServerOptions()...)...)
	cp.srv.Register(g)
	go func() { _ = g.Serve(ln) }()
	defer g.GracefulStop()
	adminAddr := ""
	if o.admin != "" {
		var stopAdmin func()
		if adminAddr, stopAdmin, err = serveAdmin(o.admin, o.adminHosts, cp.srv.AdminHandler(), log); err != nil {
			return fail(fmt.Errorf("admin: %w", err))
		}
		defer stopAdmin()
	}
	go cp.watch(ctx, o, log)
	log.Info("serving xDS", zap.String("listen", ln.Addr().String()), zap.String("admin", adminAddr),
		zap.String("pools", o.pools), zap.Int("services", len(f.Services)), zap.Bool("tls", o.tls()))
	if ready != nil {
		ready(ln.Addr().String(), adminAddr)
	}
	<-ctx.Done()
	return 0
}

// grpcOptions are the xDS gRPC server's options: TLS when asked for, and keepalives.
func grpcOptions(o xdsOptions) ([]grpc.ServerOption, error) {
	var opts []grpc.ServerOption
	if o.tls() {
		creds, err := serverTLS(o)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(creds))
	}
	return append(opts, xds.ServerOptions()...), nil
}

// controlPlane is the xDS server and the health checks that feed it.
type controlPlane struct {
	srv  *xds.Server
	mon  *health.Monitor
	hold *time.Timer // publishes without every first verdict once their bound is over
}

// startControlPlane starts the health checks of f's services and the xDS server they
// feed, which holds its first snapshots until the checks' first verdicts are in.
func startControlPlane(ctx context.Context, f *pools.File, o xdsOptions, log *zap.Logger) (*controlPlane, error) {
	cp := &controlPlane{}
	hlog := healthlog.New(log)
	services := pools.HealthServices(f.Services)
	first := newFirstVerdicts(services)
	cp.mon = health.NewMonitor(func(service string, tr health.Transition) {
		hlog.Transition(service, tr)
		first.decided(service, tr.ID)
		cp.srv.Stats.HealthTransitions.Add(1)
		cp.srv.RecordTransition(service, tr)
		if err := cp.srv.Refresh(); err != nil {
			log.Error("publishing health", zap.Error(err))
		}
	})
	xopts := append(o.limits(), xds.WithFirstVerdicts(first.ready), xds.WithProbes(cp.mon.Lookup))
	if o.clientCA != "" {
		// mTLS: a node id speaks only for the certificate that covers it.
		xopts = append(xopts, xds.WithNodeIdentity())
	}
	cp.srv = xds.NewServer(ctx, f, func(svc string, b *pools.Backend) health.State { return cp.mon.View(svc, b.Identity()) }, log, xopts...)
	if err := cp.mon.Apply(ctx, services); err != nil {
		cp.mon.Stop()
		return nil, err
	}
	// The probes have started: every target is decided within the longest bound.
	cp.hold = time.AfterFunc(first.bound, first.release)
	return cp, nil
}

// watch reloads the pools file when it changes, retargeting the health checks, until ctx
// ends.
func (cp *controlPlane) watch(ctx context.Context, o xdsOptions, log *zap.Logger) {
	xds.Watch(ctx, o.pools, o.poll, cp.srv, log, func(nf *pools.File) {
		if err := cp.mon.Apply(ctx, pools.HealthServices(nf.Services)); err != nil {
			log.Error("retargeting health checks", zap.Error(err))
		}
	})
}

func (cp *controlPlane) stop() {
	cp.hold.Stop()
	cp.mon.Stop()
}

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
		w.bound = max(w.bound, s.Config.FirstVerdictWithin()+xds.FirstVerdictSlack)
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
	cfg, err := tlsConfig(o.tlsCert, o.tlsKey, o.clientCA, tls.RequireAndVerifyClientCert)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

// tlsConfig is a server's TLS: its key pair and, when clientCA is set, the client
// certificates it verifies (as auth says).
func tlsConfig(certFile, keyFile, clientCA string, auth tls.ClientAuthType) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the TLS key pair: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pool, err := certpool.FromFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("reading the client CA: %w", err)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, auth
	}
	return cfg, nil
}
