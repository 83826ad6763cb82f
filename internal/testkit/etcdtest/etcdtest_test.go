package etcdtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
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
	// timeout (1 s), and a request meanwhile times out.
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

// The member command is built once into the shared cache and reused, and a member dies
// with the process that started it (Pdeathsig) when that is killed rather than ended.
func TestMemberBuildCachedAndDiesWithParent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs etcd: skipped under -short")
	}
	bin := binary(t)
	if filepath.Dir(bin) != filepath.Join(os.TempDir(), "stickylb-etcdtest") {
		t.Fatalf("member built at %s, not in the shared cache", bin)
	}
	again, err := buildCached()
	if err != nil || again != bin {
		t.Fatalf("second build: %s %v, want the cached %s", again, err, bin)
	}
	// A child test binary starts a cluster and is SIGKILLed: its member must die too.
	if os.Getenv("ETCDTEST_CHILD") != "" {
		c := Start(t, 1, "127.0.0.1")
		fmt.Println("pid", c.Members()[0].cmd.Process.Pid)
		select {} // killed by the parent
	}
	child := exec.Command(os.Args[0], "-test.run", "^TestMemberBuildCachedAndDiesWithParent$", "-test.v")
	child.Env = append(os.Environ(), "ETCDTEST_CHILD=1")
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	pid := 0
	sc := bufio.NewScanner(out)
	for pid == 0 && sc.Scan() {
		fmt.Sscanf(sc.Text(), "pid %d", &pid)
	}
	if pid == 0 {
		child.Process.Kill()
		t.Fatal("the child test binary started no member")
	}
	child.Process.Kill()
	child.Wait()
	testwait.For(t, 10*time.Second, "the member of a killed test binary exits", func() (bool, string) {
		err := syscall.Kill(pid, 0)
		return errors.Is(err, syscall.ESRCH), fmt.Sprintf("pid %d: %v", pid, err)
	})
}
