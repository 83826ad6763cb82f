package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/stickylb/stickylb/internal/hostcheck"
	"github.com/stickylb/stickylb/xds"
	"github.com/stickylb/stickylb/xds/api"
	"github.com/stickylb/stickylb/xds/replica"
)

// replicaFlags are `stickylb xds`'s flags of the replicated mode.
type replicaFlags struct {
	store        storeFlags
	id           string
	leaseTTL     int
	storeTimeout time.Duration
	api          string
	apiCert      string
	apiKey       string
	apiClientCA  string
	apiNames     string
	apiTokens    string
	apiHosts     hostList
}

func (f *replicaFlags) register(fs *flag.FlagSet) {
	f.store.register(fs)
	fs.StringVar(&f.id, "replica-id", "", "this replica's id in the election and on its status page (default HOST:LISTEN-PORT)")
	fs.IntVar(&f.leaseTTL, "lease-ttl", int(replica.DefaultLeaseTTL/time.Second), "seconds: the election's lease; a leader that stops answering is replaced within it")
	fs.DurationVar(&f.storeTimeout, "store-timeout", replica.DefaultStoreTimeout, "with no answer from etcd for this long, end every xDS stream and refuse new ones until it answers")
	fs.StringVar(&f.api, "api", "", "address of the change API (HTTPS with --api-cert/--api-key; plaintext only on a loopback address)")
	fs.StringVar(&f.apiCert, "api-cert", "", "the API's certificate (PEM)")
	fs.StringVar(&f.apiKey, "api-key", "", "the API's key (PEM)")
	fs.StringVar(&f.apiClientCA, "api-client-ca", "", "CA bundle (PEM) of the API's client certificates: a CA of its own, not the nodes' xDS CA (with --api-client-names)")
	fs.StringVar(&f.apiNames, "api-client-names", "", "comma-separated names (common name, DNS or URI SAN) of the client certificates that may change the fleet; \"*\": every one --api-client-ca signs")
	fs.StringVar(&f.apiTokens, "api-tokens", "", "file of `NAME TOKEN` lines: bearer tokens that authenticate to the API")
	fs.Var(&f.apiHosts, "api-host", "more Host names the API answers (comma-separated or repeated; it always answers its own address, localhost when that is loopback, and any IP address when it listens on all of them): other names are refused with 421 (DNS rebinding)")
}

// minStoreTimeout is the shortest --store-timeout: etcd's own leader election (its
// election timeout, 1 s by default) must not look like a lost store.
const minStoreTimeout = time.Second

// serveReplica runs one replica until ctx ends; ready, when set, receives the bound
// addresses (xDS, admin, API).
func serveReplica(ctx context.Context, o xdsOptions, log *zap.Logger, stderr io.Writer, ready func(grpcAddr, adminAddr, apiAddr string)) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "stickylb xds: %v\n", err)
		return 1
	}
	rf := o.replica
	if rf.leaseTTL < 1 {
		return fail(errors.New("--lease-ttl is whole seconds, at least 1"))
	}
	if rf.storeTimeout < minStoreTimeout {
		return fail(fmt.Errorf("--store-timeout %s: at least %s (etcd takes about a second to elect a leader of its own; a shorter timeout would end every stream at each election)",
			rf.storeTimeout, minStoreTimeout))
	}
	var apiHandler *api.Server
	var apiServed http.Handler
	opts, err := grpcOptions(o)
	if err != nil {
		return fail(err)
	}
	scfg := rf.store.config()
	cli, err := scfg.Client(log)
	if err != nil {
		return fail(err)
	}
	defer cli.Close()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fail(fmt.Errorf("listening for xDS: %w", err))
	}
	if rf.id == "" {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		rf.id = net.JoinHostPort(host, port)
	}
	var apiLn net.Listener
	if rf.api != "" {
		auth, err := apiAuth(rf)
		if err != nil {
			ln.Close()
			return fail(err)
		}
		if apiLn, err = apiListener(rf); err != nil {
			ln.Close()
			return fail(err)
		}
		apiHandler = api.New(cli, scfg.Keys(), auth, log)
		if apiServed, err = apiGuard(rf, apiHandler.Handler(), log); err != nil {
			apiLn.Close()
			ln.Close()
			return fail(err)
		}
	}
	xopts := o.limits()
	if o.clientCA != "" {
		xopts = append(xopts, xds.WithNodeIdentity())
	}
	r := replica.New(ctx, replica.Config{ID: rf.id, Keys: scfg.Keys(), LeaseTTL: time.Duration(rf.leaseTTL) * time.Second,
		StoreTimeout: rf.storeTimeout}, cli, log, xopts...)
	g := grpc.NewServer(append(append(opts, r.Server().GRPCServerOptions()...), grpc.ChainStreamInterceptor(r.Gate().StreamInterceptor()))...)
	r.Server().Register(g)
	registerHealth(g, r.Gate())
	go func() { _ = g.Serve(ln) }()
	defer g.Stop()
	adminAddr := ""
	if o.admin != "" {
		collectors := []prometheus.Collector{r.Collector()}
		if apiHandler != nil {
			collectors = append(collectors, apiHandler.Collector())
		}
		var stopAdmin func()
		if adminAddr, stopAdmin, err = serveAdmin(o.admin, o.adminHosts, r.Server().AdminHandler(collectors...), log); err != nil {
			return fail(fmt.Errorf("admin: %w", err))
		}
		defer stopAdmin()
	}
	apiAddr := ""
	if apiLn != nil {
		apiAddr = apiLn.Addr().String()
		defer serveHTTP(apiLn, apiServed, serverLimits())()
	}
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	log.Info("serving xDS as a replica", zap.String("replica", rf.id), zap.String("listen", ln.Addr().String()),
		zap.String("admin", adminAddr), zap.String("api", apiAddr), zap.Strings("etcd", scfg.Endpoints),
		zap.String("prefix", rf.store.prefix), zap.Bool("tls", o.tlsCert != ""))
	if ready != nil {
		ready(ln.Addr().String(), adminAddr, apiAddr)
	}
	<-ctx.Done()
	<-done // the leader resigns, so the next one takes over without waiting for the lease
	return 0
}

// registerHealth serves grpc.health.v1 on g: SERVING while gate admits xDS streams, for
// the health checks of an Envoy bootstrap (or a load balancer) in front of the replicas.
func registerHealth(g *grpc.Server, gate *replica.Gate) {
	hs := grpchealth.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	gate.OnChange(func(open bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if open {
			st = healthpb.HealthCheckResponse_SERVING
		}
		hs.SetServingStatus("", st)
	})
}

// apiMaxConns caps the change API's connections (an operator's console, a few scripts):
// more wait in the listen queue until one closes.
const apiMaxConns = 64

// apiHostHint says, in a refusal, which Host names the API answers.
const apiHostHint = "it answers its listen address, localhost when that is loopback, any IP address when it listens on all of them, and the names given with --api-host"

// apiGuard serves the API only to requests whose Host is one of its names (see
// internal/hostcheck): a browser holding an operator's client certificate, led to the
// API's address by a DNS rebinding, would present that certificate for another name's page.
func apiGuard(rf replicaFlags, h http.Handler, log *zap.Logger) (http.Handler, error) {
	names, err := hostcheck.ForListen(rf.api, rf.apiHosts...)
	if err != nil {
		return nil, fmt.Errorf("--api-host: %w", err)
	}
	return names.Guard(h, apiHostHint, func(r *http.Request) {
		log.Warn("refused an API request for a name the API does not have (DNS rebinding, or a name to add with --api-host)",
			zap.String("host", logCut(r.Host)), zap.String("remote", r.RemoteAddr), zap.String("path", logCut(r.URL.Path)))
	}), nil
}

// apiAuth reads the API's credentials: tokens and/or client certificates by name, at
// least one.
func apiAuth(rf replicaFlags) (*api.Auth, error) {
	if rf.apiTokens == "" && rf.apiClientCA == "" {
		return nil, errors.New("--api needs --api-tokens FILE or --api-client-ca FILE: the API authenticates every request")
	}
	var names []string
	for _, n := range strings.Split(rf.apiNames, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	if (rf.apiClientCA == "") != (len(names) == 0) {
		return nil, errors.New(`--api-client-ca and --api-client-names go together: name the client certificates that may change the fleet (or "*" for every one the CA signs: then give the API a CA of its own, never the nodes' xDS CA)`)
	}
	var tokens map[string]string
	if rf.apiTokens != "" {
		var err error
		if tokens, err = api.LoadTokens(rf.apiTokens); err != nil {
			return nil, fmt.Errorf("reading --api-tokens: %w", err)
		}
	}
	return api.NewAuth(tokens, names), nil
}

// apiListener listens for the API: TLS with --api-cert/--api-key, else plaintext on a
// loopback address only.
func apiListener(rf replicaFlags) (net.Listener, error) {
	if rf.apiCert == "" && rf.apiKey == "" {
		if rf.apiClientCA != "" {
			return nil, errors.New("--api-client-ca needs --api-cert and --api-key (client certificates need TLS)")
		}
		host, _, err := net.SplitHostPort(rf.api)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("--api %s: without --api-cert and --api-key the API serves plaintext, on a loopback address only", rf.api)
		}
		ln, err := net.Listen("tcp", rf.api)
		if err != nil {
			return nil, err
		}
		return netutil.LimitListener(ln, apiMaxConns), nil
	}
	// A certificate authenticates when given; without one a bearer token may.
	cfg, err := tlsConfig(rf.apiCert, rf.apiKey, rf.apiClientCA, tls.VerifyClientCertIfGiven)
	if err != nil {
		return nil, fmt.Errorf("the API's TLS: %w", err)
	}
	ln, err := net.Listen("tcp", rf.api)
	if err != nil {
		return nil, err
	}
	return tls.NewListener(netutil.LimitListener(ln, apiMaxConns), cfg), nil
}
