package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/stickylb/stickylb/xds"
)

// xdsOptions are `stickylb xds`'s flags.
type xdsOptions struct {
	pools, listen, admin      string
	adminHosts                hostList // more Host names the admin address answers
	tlsCert, tlsKey, clientCA string
	poll                      time.Duration
	maxNodes                  int
	// The bounds on nodes and streams (xds.With...): see docs/xds.md.
	maxNodesPerIdentity, maxStreams, maxStreamsPerNode, maxStreamsPerConn int
	firstRequest                                                          time.Duration
	// replica: the replicated mode's flags (--etcd and what goes with it).
	replica replicaFlags
}

// replicated reports whether the flags ask for a replica of the replicated mode (--etcd).
func (o *xdsOptions) replicated() bool { return o.replica.store.etcd != "" }

// register adds the flags to fs, at their defaults.
func (o *xdsOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.pools, "pools", "", "pools file to serve (reloaded when it changes)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:18000", "gRPC address for ADS and the per-type xDS services")
	fs.StringVar(&o.admin, "admin", "", "HTTP address for the status page at / (status.json beside it), /healthz (503 while a replica has lost its store), /livez, /metrics and /config (off when empty; unauthenticated: keep it private)")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "server certificate (PEM) for TLS")
	fs.StringVar(&o.tlsKey, "tls-key", "", "server key (PEM)")
	fs.StringVar(&o.clientCA, "client-ca", "", "CA bundle (PEM): require client certificates signed by it (mTLS)")
	fs.DurationVar(&o.poll, "poll", time.Second, "how often to look for pools-file changes")
	fs.Var(&o.adminHosts, "admin-host", "more Host names the admin address answers (comma-separated or repeated; it always answers its own address, localhost when that is loopback, and any IP address when it listens on all of them): other names are refused with 421 (DNS rebinding)")
	fs.IntVar(&o.maxNodes, "max-nodes", xds.DefaultMaxNodes, "node ids that may hold streams at once; beyond it a new node is refused (ResourceExhausted)")
	fs.IntVar(&o.maxNodesPerIdentity, "max-nodes-per-identity", xds.DefaultMaxNodesPerIdentity, "node ids one identity (the client certificate under --client-ca, else the peer's IP address) may hold at once, checked before --max-nodes")
	fs.IntVar(&o.maxStreams, "max-streams", xds.DefaultMaxStreams, "xDS streams open at once, those still waiting for their first request included; beyond it a new stream is refused (ResourceExhausted)")
	fs.IntVar(&o.maxStreamsPerNode, "max-streams-per-node", xds.DefaultMaxStreamsPerNode, "streams one node id may hold at once (one ADS stream, or one per type, and reconnects)")
	fs.IntVar(&o.maxStreamsPerConn, "max-streams-per-conn", xds.DefaultMaxStreamsPerConn, "concurrent streams on one connection (HTTP/2 MAX_CONCURRENT_STREAMS)")
	fs.DurationVar(&o.firstRequest, "first-request-timeout", xds.DefaultFirstRequestTimeout, "how long a new stream may take to send its first request for a type the server serves before it is ended")
	o.replica.register(fs)
}

// tls reports whether the flags ask for TLS (serverTLS checks that they go together).
func (o *xdsOptions) tls() bool { return o.tlsCert != "" || o.tlsKey != "" || o.clientCA != "" }

// errXDSUsage is a command line parseXDSFlags refused after its flags parsed: neither
// --pools nor --etcd, both, or arguments left over.
var errXDSUsage = errors.New("stickylb xds: usage")

// parseXDSFlags reads `stickylb xds`'s arguments. Its error is flag.ErrHelp for -h, or a
// usage error already reported on stderr (parseError gives the exit status of either).
func parseXDSFlags(args []string, stderr io.Writer) (xdsOptions, error) {
	fs := newFlagSet("xds", xdsUsage, stderr)
	var o xdsOptions
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.replicated() && o.pools != "" {
		fmt.Fprint(stderr, "stickylb xds: --etcd and --pools exclude each other: the replicas serve the pools file stored in etcd; load it with `stickylb pools apply FILE --etcd URL`\n")
		return o, errXDSUsage
	}
	if o.pools == "" && !o.replicated() || fs.NArg() != 0 {
		fmt.Fprint(stderr, xdsUsage)
		return o, errXDSUsage
	}
	if err := checkAdminHosts("--admin", o.admin, o.adminHosts); err != nil {
		fmt.Fprintf(stderr, "stickylb xds: %v\n", err)
		return o, errXDSUsage
	}
	return o, nil
}

// limits are the server options of the flags that bound nodes and streams.
func (o *xdsOptions) limits() []xds.Option {
	return []xds.Option{xds.WithMaxNodes(o.maxNodes), xds.WithMaxNodesPerIdentity(o.maxNodesPerIdentity),
		xds.WithMaxStreams(o.maxStreams), xds.WithMaxStreamsPerNode(o.maxStreamsPerNode),
		xds.WithMaxStreamsPerConn(o.maxStreamsPerConn), xds.WithFirstRequestTimeout(o.firstRequest)}
}
