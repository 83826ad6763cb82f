package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds/store"
)

const poolsUsage = `usage:
  stickylb pools apply FILE --etcd URL[,URL...] [--etcd-prefix P] [--etcd-ca F [--etcd-cert F --etcd-key F]] [--if-revision N | --force] [--as NAME]
  stickylb pools get --etcd URL[,URL...] [--etcd-prefix P] [--etcd-ca F [--etcd-cert F --etcd-key F]]

apply validates FILE as validate does and stores it for the replicas, with a compare-and-swap
on the revision it read. When someone else stored the file last (a change through the API,
another operator), apply refuses: look at it with get, then apply with --if-revision N (the
revision you read) or --force. A job that applies a file of record names itself with --as,
so its own last apply is not someone else's. get prints the stored file, its revision on
stderr.
`

// storeFlags are the flags of every command that reaches the store.
type storeFlags struct {
	etcd, prefix, ca, cert, key string
}

func (s *storeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.etcd, "etcd", "", "etcd client URLs, comma-separated (http://HOST:2379 or https://...)")
	fs.StringVar(&s.prefix, "etcd-prefix", store.DefaultPrefix, "the key prefix of this control plane's state in etcd")
	fs.StringVar(&s.ca, "etcd-ca", "", "CA bundle (PEM) that signs the etcd members' certificates")
	fs.StringVar(&s.cert, "etcd-cert", "", "client certificate (PEM) for etcd")
	fs.StringVar(&s.key, "etcd-key", "", "client key (PEM) for etcd")
}

func (s storeFlags) config() store.Config {
	var eps []string
	for _, e := range strings.Split(s.etcd, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	return store.Config{Endpoints: eps, Prefix: s.prefix, CA: s.ca, Cert: s.cert, Key: s.key}
}

// parseInterspersed parses flags that may come before or after the positional arguments,
// which it returns.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// whoAmI is USER@HOST, recorded with what this command stores.
func whoAmI() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil {
		host = "localhost"
	}
	return name + "@" + host
}

func poolsCmd(args []string, stdout, stderr io.Writer) int {
	sub := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	fs := newFlagSet(strings.TrimSpace("pools "+sub), poolsUsage, stderr)
	var sf storeFlags
	sf.register(fs)
	ifRev := fs.Int64("if-revision", -1, "apply: store only if the stored file is at this revision (0: only into an empty store); default: the revision read just before")
	force := fs.Bool("force", false, "apply: store even when someone else stored the file last (their change is overwritten)")
	as := fs.String("as", "", "apply: the name the change is recorded under (default USER@HOST)")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for etcd")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return parseError(err)
	}
	if sub != "apply" && sub != "get" || sf.etcd == "" || (sub == "apply") != (len(pos) == 1) || (sub == "get" && len(pos) != 0) {
		fmt.Fprint(stderr, poolsUsage)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	cfg := sf.config()
	if sub == "apply" {
		me := *as
		if me == "" {
			me = whoAmI()
		}
		return poolsApply(ctx, cfg, pos[0], me, *ifRev, *force, stdout, stderr)
	}
	cli, err := cfg.Client(zap.NewNop())
	if err != nil {
		fmt.Fprintf(stderr, "stickylb pools get: %v\n", err)
		return 1
	}
	defer cli.Close()
	doc, err := store.GetDocument(ctx, cli, cfg.Keys())
	if err != nil {
		fmt.Fprintf(stderr, "stickylb pools get: %v\n", err)
		return 1
	}
	if doc == nil {
		fmt.Fprintf(stderr, "stickylb pools get: the store holds no pools file under %s: load one with `stickylb pools apply FILE --etcd ...`\n", cfg.Keys().Pools())
		return 1
	}
	stdout.Write(doc.YAML)
	fmt.Fprintf(stderr, "revision %d (stored by %s at %s, %s)\n", doc.Revision, doc.Change.By, doc.Change.At.Format(time.RFC3339), doc.Change.Op)
	return 0
}

// poolsApply validates the file exactly as `validate` does, then stores those bytes as me
// with a compare-and-swap on the revision it read (or the one given). Without a revision
// given it refuses to overwrite a file someone else stored last, unless forced.
func poolsApply(ctx context.Context, cfg store.Config, path, me string, ifRev int64, force bool, stdout, stderr io.Writer) int {
	if fi, err := os.Stat(path); err == nil && fi.Size() > store.MaxDocument {
		fmt.Fprintf(stderr, "%s: %d bytes; the store takes a pools file of at most %d bytes (1 MiB: etcd's requests are limited to 1.5 MiB)\n", path, fi.Size(), store.MaxDocument)
		return 1
	}
	data, err := pools.ReadFile(path)
	if err != nil {
		printErrors(err, stderr)
		return 1
	}
	if len(data) > store.MaxDocument { // grew since the stat
		fmt.Fprintf(stderr, "%s: %d bytes; the store takes a pools file of at most %d bytes (1 MiB)\n", path, len(data), store.MaxDocument)
		return 1
	}
	f, ok := parseFile(path, data, stderr)
	if !ok {
		return 1
	}
	cli, err := cfg.Client(zap.NewNop())
	if err != nil {
		fmt.Fprintf(stderr, "stickylb pools apply: %v\n", err)
		return 1
	}
	defer cli.Close()
	var accept func(*store.Document) error
	if ifRev < 0 && !force {
		accept = func(old *store.Document) error {
			return overwriteCheck(old, me, "stickylb pools get", "--if-revision", "apply")
		}
	}
	_, rev, err := store.ReplaceDocument(ctx, cli, cfg.Keys(), data, ifRev, store.Change{By: me, Op: "apply"}, accept)
	if err != nil { // a conflict names the stored revision and who stored it
		fmt.Fprintf(stderr, "stickylb pools apply: %v\n", err)
		return 1
	}
	backends := 0
	for _, s := range f.Services {
		backends += len(s.Backends)
	}
	fmt.Fprintf(stdout, "%s: stored at revision %d (%d services, %d backends)\n", path, rev, len(f.Services), backends)
	return 0
}

// overwriteCheck refuses to replace a stored file that someone other than me stored last
// (a drain through the API, another operator's apply): replacing it would undo their
// change unseen. read names the command that shows it, pin the flag that names the
// revision read, and verb the command refused.
func overwriteCheck(old *store.Document, me, read, pin, verb string) error {
	if old == nil || old.Change.By == me {
		return nil
	}
	return fmt.Errorf("the stored pools file (revision %d) was stored last by %s at %s (%s), not by you (%s): this %s would overwrite that change. "+
		"Look at it with `%s`, carry it into your file, then %s with %s %d; or add --force to overwrite it",
		old.Revision, old.Change.By, old.Change.At.UTC().Format(time.RFC3339), old.Change.Op, me, verb, read, verb, pin, old.Revision)
}
