// Package store is the replicated control plane's state in etcd: the pools file as
// applied (one document, changed only by a compare-and-swap on its revision) and the
// health verdicts the leading replica writes, each write fenced by the leader's election
// key. Replicas read it all at one revision and watch it from there, so every replica
// serves the same state under the same version.
//
// Keys, under the prefix (default /stickylb):
//
//	PREFIX/state/pools              the pools file, as the operator wrote it (YAML)
//	PREFIX/state/pools-by           who stored it, when, and how (JSON)
//	PREFIX/state/verdicts/SVC/ID    one backend's verdict (JSON)
//	PREFIX/state/revision           touched by every write to the state: its revision is the
//	                                revision of the last write, deletes included
//	PREFIX/election/LEASE           the replicas' election (one key per live replica)
package store

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/internal/certpool"
)

// DefaultPrefix is where the state lives unless --etcd-prefix says otherwise.
const DefaultPrefix = "/stickylb"

// MaxDocument is the largest pools file the store takes: etcd refuses requests over
// 1.5 MiB by default, and a document must fit in one with its metadata.
const MaxDocument = 1 << 20

// Config says how to reach etcd.
type Config struct {
	// Endpoints are the members' client URLs (http://HOST:2379, https://...).
	Endpoints []string
	// Prefix is where the state lives (DefaultPrefix when empty).
	Prefix string
	// CA verifies the members' certificates; Cert and Key are the client's (mTLS). Files, PEM.
	CA, Cert, Key string
	// DialTimeout bounds the first connection (default 5 s).
	DialTimeout time.Duration
}

// Keys names the store's keys under a prefix.
type Keys struct{ prefix string }

// KeysOf returns the keys under prefix (DefaultPrefix when empty); a trailing '/' is
// dropped.
func KeysOf(prefix string) Keys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Keys{prefix: strings.TrimRight(prefix, "/")}
}

// Keys are the configuration's keys.
func (c Config) Keys() Keys { return KeysOf(c.Prefix) }

// State is the prefix of everything replicas serve (watched as one).
func (k Keys) State() string { return k.prefix + "/state/" }

// Pools is the pools file's key.
func (k Keys) Pools() string { return k.prefix + "/state/pools" }

// PoolsBy is the key of who stored the pools file.
func (k Keys) PoolsBy() string { return k.prefix + "/state/pools-by" }

// Revision is the key every state write touches.
func (k Keys) Revision() string { return k.prefix + "/state/revision" }

// Verdicts is the prefix of the verdicts.
func (k Keys) Verdicts() string { return k.prefix + "/state/verdicts/" }

// Verdict is the key of one backend's verdict. Service names hold no '/', so the first
// one after the prefix ends the service and the identity may hold any.
func (k Keys) Verdict(v VerdictKey) string { return k.Verdicts() + v.Service + "/" + v.ID }

// Election is the prefix of the replicas' election.
func (k Keys) Election() string { return k.prefix + "/election/" }

// Client connects to the store. The client's own log is quiet unless it errs.
func (c Config) Client(log *zap.Logger) (*clientv3.Client, error) {
	if len(c.Endpoints) == 0 {
		return nil, errors.New("no etcd endpoint")
	}
	cfg := clientv3.Config{Endpoints: c.Endpoints, DialTimeout: c.DialTimeout,
		// A member cut off from its quorum must not keep a watch quiet forever; keepalives
		// also find a dead connection where no request is in flight.
		DialKeepAliveTime: 2 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
		Logger: log.Named("etcd").WithOptions(zap.IncreaseLevel(zap.ErrorLevel))}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if c.CA != "" || c.Cert != "" || c.Key != "" {
		t, err := c.tls()
		if err != nil {
			return nil, err
		}
		cfg.TLS = t
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd %s: %w", strings.Join(c.Endpoints, ","), err)
	}
	return cli, nil
}

func (c Config) tls() (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CA != "" {
		pool, err := certpool.FromFile(c.CA)
		if err != nil {
			return nil, fmt.Errorf("reading the etcd CA: %w", err)
		}
		t.RootCAs = pool
	}
	if (c.Cert == "") != (c.Key == "") {
		return nil, errors.New("--etcd-cert and --etcd-key go together")
	}
	if c.Cert != "" {
		cert, err := tls.LoadX509KeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, fmt.Errorf("loading the etcd client key pair: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}
