package status

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestConfigLog: a refused edit keeps its first MaxRefusedErrors errors and counts the
// rest, an applied edit clears it and moves Loaded, and the JSON carries it under "config";
// a tier without a file has no "config".
func TestConfigLog(t *testing.T) {
	start := time.Unix(1700000000, 0).UTC()
	l := NewConfigLog("/etc/stickylb/pools.yaml", start)
	var errs []string
	for i := 1; i <= MaxRefusedErrors+2; i++ {
		errs = append(errs, fmt.Sprintf("/etc/stickylb/pools.yaml:%d:1: bad", i))
	}
	l.Refused(start.Add(time.Minute), errs)
	errs[0] = "changed by the caller"
	f := l.File()
	if f.Loaded != start || f.Refused == nil || len(f.Refused.Errors) != MaxRefusedErrors || f.Refused.More != 2 ||
		f.Refused.Errors[0] != "/etc/stickylb/pools.yaml:1:1: bad" || !f.Refused.Time.Equal(start.Add(time.Minute)) {
		t.Fatalf("after a refused edit: %+v %+v", f, f.Refused)
	}
	b, err := json.Marshal(Snapshot{Tier: TierXDS, Config: f})
	if err != nil {
		t.Fatal(err)
	}
	if want := `"config":{"path":"/etc/stickylb/pools.yaml","loaded":"2023-11-14T22:13:20Z","refused":{"time":"2023-11-14T22:14:20Z","errors":["/etc/stickylb/pools.yaml:1:1: bad",`; !strings.Contains(string(b), want) ||
		!strings.Contains(string(b), `"more":2}}`) {
		t.Fatalf("JSON %s, want %s...", b, want)
	}
	l.Applied(start.Add(2 * time.Minute))
	if f := l.File(); f.Refused != nil || !f.Loaded.Equal(start.Add(2*time.Minute)) {
		t.Fatalf("after an applied edit: %+v", f)
	}
	var none *ConfigLog
	b, _ = json.Marshal(Snapshot{Tier: TierXDP, Config: none.File()})
	if strings.Contains(string(b), "config") {
		t.Fatalf("a tier without a file: %s", b)
	}
}
