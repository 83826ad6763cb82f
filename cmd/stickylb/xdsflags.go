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
	tlsCert, tlsKey, clientCA string
	poll                      time.Duration
	maxNodes                  int
	// replica: the replicated mode's flags (--etcd and what goes with it).
	replica replicaFlags
}

// replicated reports whether the flags ask for a replica of the replicated mode (--etcd).
func (o *xdsOptions) replicated() bool { return o.replica.store.etcd != "" }

// register adds the flags to fs, at their defaults.
func (o *xdsOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.pools, "pools", "", "pools file to serve (reloaded when it changes)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:18000", "gRPC address for ADS and the per-type xDS services")
	fs.StringVar(&o.admin, "admin", "", "HTTP address for the status page at / (status.json beside it), /healthz, /metrics and /config (off when empty; unauthenticated: keep it private)")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "server certificate (PEM) for TLS")
	fs.StringVar(&o.tlsKey, "tls-key", "", "server key (PEM)")
	fs.StringVar(&o.clientCA, "client-ca", "", "CA bundle (PEM): require client certificates signed by it (mTLS)")
	fs.DurationVar(&o.poll, "poll", time.Second, "how often to look for pools-file changes")
	fs.IntVar(&o.maxNodes, "max-nodes", xds.DefaultMaxNodes, "node ids that may hold streams at once; beyond it a new node is refused (ResourceExhausted)")
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
	return o, nil
}
