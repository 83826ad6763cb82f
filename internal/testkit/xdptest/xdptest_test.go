package xdptest

import (
	"testing"

	"github.com/stickylb/stickylb/policies/pools"
)

// TestLoader: the loader is live: it applies a file and reports its service. (Its cleanup's
// detach fails the test if the program was not attached where the loader said.)
func TestLoader(t *testing.T) {
	l := Loader(t, "slxt")
	f, err := pools.Parse("pools.yaml", []byte(`services:
  - name: web
    protocol: tcp
    vip: 10.0.0.100:80
    balance: maglev
    backends:
      - {address: 127.0.0.1:80, mac: "02:00:00:00:00:01"}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Apply(t.Context(), f); err != nil {
		t.Fatal(err)
	}
	snap, err := l.Status()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Services) != 1 || snap.Services[0].Name != "web" {
		t.Fatalf("status services %+v, want web", snap.Services)
	}
}
