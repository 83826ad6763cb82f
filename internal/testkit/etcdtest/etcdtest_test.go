package etcdtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// A three-member cluster serves, keeps serving with one member killed, and serves again
// once every member was stopped and started again, on its data.
func TestClusterStopKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs etcd: skipped under -short")
	}
	c := Start(t, 3, "127.0.0.1")
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	c.Members()[0].Kill()
	// The killed member may have led: the other two elect a leader within an election
	// timeout (500 ms), and a request meanwhile times out.
	testwait.For(t, 10*time.Second, "a write on two of three members", func() (bool, string) {
		_, err := cli.Put(ctx, "k", "v2")
		return err == nil, fmt.Sprint(err)
	})
	c.StopAll()
	c.RestartAll(t)
	WaitHealthy(t, cli, 20*time.Second)
	r, err := cli.Get(ctx, "k")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v2" {
		t.Fatalf("after the restart: %v %v", r, err)
	}
}
