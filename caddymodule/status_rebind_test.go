package caddymodule

import (
	"fmt"
	"testing"

	"github.com/stickylb/stickylb/policies/status"
)

// TestStatusDrainRebinding: a browser whose page came from evil.example, a name that now
// resolves to the status site's address (DNS rebinding), sends Origin and Host both
// evil.example: same-origin to the CSRF check. On a catch-all site a drain then needs a
// loopback Host (localhost or a loopback address); on a named site only the site's names
// reach the handler at all.
func TestStatusDrainRebinding(t *testing.T) {
	a1, _ := statusBackend(t, "b1")
	proxyPort, anyPort, namedPort, adminPort := statusFreePort(t), statusFreePort(t), statusFreePort(t), statusFreePort(t)
	cf := fmt.Sprintf(`{
	admin localhost:%d
	auto_https off
	skip_install_trust
	http_port %d
}
:%d {
	reverse_proxy %s
}
:%d {
	stickylb_status
}
http://status.example:%d {
	stickylb_status
}
`, adminPort, proxyPort, proxyPort, a1, anyPort, namedPort)
	runCaddyfile(t, cf)
	t.Cleanup(func() { drains.undrain(a1) })
	body := `{"upstream":"` + a1 + `"}`
	drain := func(port int, host string) (int, string, bool) {
		t.Helper()
		drains.undrain(a1)
		code, b := statusDoHost(t, "POST", fmt.Sprintf("http://127.0.0.1:%d/drain", port), host, body,
			status.CSRFHeader, "1", "Sec-Fetch-Site", "same-origin", "Origin", "http://"+host)
		return code, b, drains.drained(a1)
	}
	refused, total := 0, 0
	for _, c := range []struct {
		port    int
		host    string
		drained bool
	}{
		{anyPort, fmt.Sprintf("evil.example:%d", anyPort), false},
		{anyPort, "evil.example", false},
		{anyPort, fmt.Sprintf("10.1.2.3:%d", anyPort), false},
		{anyPort, fmt.Sprintf("localhost.evil.example:%d", anyPort), false},
		{anyPort, fmt.Sprintf("127.0.0.1:%d", anyPort), true},
		{anyPort, fmt.Sprintf("localhost:%d", anyPort), true},
		{anyPort, fmt.Sprintf("[::1]:%d", anyPort), true},
		{namedPort, fmt.Sprintf("evil.example:%d", namedPort), false},
		{namedPort, fmt.Sprintf("status.example:%d", namedPort), true},
	} {
		code, b, drained := drain(c.port, c.host)
		if !c.drained {
			total++
			if !drained {
				refused++
			}
		}
		if drained != c.drained {
			t.Errorf("drain on :%d with Host %s: %d %q, drained %v, want %v", c.port, c.host, code, b, drained, c.drained)
		}
	}
	t.Logf("refused %d of %d drains with a foreign Host", refused, total)
}
