// Command member is one etcd member for tests (go.etcd.io/etcd/server/v3/embed, the server
// of the client version the project uses): etcdtest starts three of them as processes, so
// a test can stop, kill or restart each alone. It prints "ready" once the member serves,
// and runs until SIGTERM or SIGINT.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	name := flag.String("name", "m0", "member name")
	dir := flag.String("data-dir", "", "data directory")
	client := flag.String("client", "", "client URL (http://IP:PORT)")
	peer := flag.String("peer", "", "peer URL (http://IP:PORT)")
	cluster := flag.String("initial-cluster", "", "NAME=PEER-URL,... of every member")
	state := flag.String("state", embed.ClusterStateFlagNew, "new or existing")
	flag.Parse()
	if err := run(*name, *dir, *client, *peer, *cluster, *state); err != nil {
		fmt.Fprintln(os.Stderr, "etcd member:", err)
		os.Exit(1)
	}
}

// Raft timing: etcd's defaults, a heartbeat every 100 ms and an election after 1 s
// without one. Measured on the 2-core test machine at load 27 (six busy loops beside other
// builds): no spurious election in 90 s at 50/500 ms either, but a member starved for half
// a second is not far from there, and the longer timeout costs a test at most a second
// more to elect after a member is killed.
const (
	tickMs     = 100
	electionMs = 1000
)

func run(name, dir, client, peer, cluster, state string) error {
	cu, err := url.Parse(client)
	if err != nil {
		return err
	}
	pu, err := url.Parse(peer)
	if err != nil {
		return err
	}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = name, dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster, cfg.ClusterState, cfg.InitialClusterToken = cluster, state, "stickylb-test"
	cfg.TickMs, cfg.ElectionMs = tickMs, electionMs
	cfg.UnsafeNoFsync = true // a test's data dies with it
	cfg.LogLevel = "warn"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("starting: %w", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return fmt.Errorf("not ready within 60 s")
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
		return nil
	case err := <-e.Err():
		return err
	}
}
