package caddymodule

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// adapt runs the real Caddyfile adapter over a site whose reverse_proxy uses policy.
func adapt(t *testing.T, policy string) (map[string]any, error) {
	t.Helper()
	src := ":8080 {\n\tstickylb\n\treverse_proxy 127.0.0.1:9001 127.0.0.1:9002 {\n\t\tlb_policy " + policy + "\n\t}\n}\n"
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		return nil, err
	}
	var cfg any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	sp := find(cfg, "selection_policy")
	if sp == nil {
		t.Fatalf("no selection_policy in %s", out)
	}
	if !strings.Contains(string(out), `"handler":"stickylb"`) {
		t.Fatalf("stickylb handler missing: %s", out)
	}
	return sp.(map[string]any), nil
}

// find returns the first value under key anywhere in v.
func find(v any, key string) any {
	switch x := v.(type) {
	case map[string]any:
		if r, ok := x[key]; ok {
			return r
		}
		for _, e := range x {
			if r := find(e, key); r != nil {
				return r
			}
		}
	case []any:
		for _, e := range x {
			if r := find(e, key); r != nil {
				return r
			}
		}
	}
	return nil
}

func TestAdaptDirectives(t *testing.T) {
	const sec = "0123456789abcdef0123456789abcdef"
	cases := []struct {
		name, policy, want string
	}{
		{"sticky_cookie defaults", "sticky_cookie {\n secret " + sec + "\n}",
			`{"policy":"sticky_cookie","secrets":["` + sec + `"]}`},
		{"sticky_cookie full", "sticky_cookie sess {\n secret {env.S} " + sec + "\n ttl 1h\n format envoy\n path /app\n domain example.com\n max_age 24h\n secure always\n http_only false\n same_site strict\n keep_cache_control\n fallback round_robin\n}",
			`{"policy":"sticky_cookie","name":"sess","secrets":["{env.S}","` + sec + `"],"ttl":3600000000000,"format":"envoy","path":"/app","domain":"example.com","max_age":86400000000000,"secure":"always","http_only":false,"same_site":"strict","keep_cache_control":true,"fallback":{"policy":"round_robin"}}`},
		{"sticky_cookie name in block, fallback with args", "sticky_cookie {\n name c\n secret " + sec + "\n fallback weighted_least_conn 3 1 {\n slow_start 10s\n }\n}",
			`{"policy":"sticky_cookie","name":"c","secrets":["` + sec + `"],"fallback":{"policy":"weighted_least_conn","weights":[3,1],"slow_start":10000000000}}`},
		{"app_cookie prefix", "app_cookie JSESSIONID {\n secret " + sec + "\n ttl 2h\n}",
			`{"policy":"app_cookie","name":"JSESSIONID","secrets":["` + sec + `"],"ttl":7200000000000}`},
		{"app_cookie learn", "app_cookie PHPSESSID {\n mode learn\n ttl 30m\n max_sessions 5000\n hash ring\n min_ring_size 2048\n max_ring_size 4096\n table shared\n}",
			`{"policy":"app_cookie","name":"PHPSESSID","mode":"learn","ttl":1800000000000,"max_sessions":5000,"hash":"ring","min_ring_size":2048,"max_ring_size":4096,"table":"shared"}`},
		{"app_cookie learn max_new_per_client", "app_cookie PHPSESSID {\n mode learn\n max_new_per_client 20\n}",
			`{"policy":"app_cookie","name":"PHPSESSID","mode":"learn","max_new_per_client":20}`},
		{"app_cookie learn max_new_per_client off", "app_cookie PHPSESSID {\n mode learn\n max_new_per_client off\n}",
			`{"policy":"app_cookie","name":"PHPSESSID","mode":"learn","max_new_per_client":-1}`},
		{"sticky_url query", "sticky_url {\n query sid\n ttl 10m\n max_sessions 100\n hash maglev\n table_size 131071\n max_key_length 64\n fallback random\n}",
			`{"policy":"sticky_url","query":"sid","ttl":600000000000,"max_sessions":100,"hash":"maglev","table_size":131071,"max_key_length":64,"fallback":{"policy":"random"}}`},
		{"sticky_url path_segment", "sticky_url {\n path_segment -1\n no_table\n}",
			`{"policy":"sticky_url","path_segment":-1,"no_table":true}`},
		{"sticky_url suffix", "sticky_url {\n suffix ;jsessionid=\n}",
			`{"policy":"sticky_url","suffix":";jsessionid="}`},
		{"sticky_header", "sticky_header X-Session {\n ttl 5m\n bounded_load 1.25\n}",
			`{"policy":"sticky_header","name":"X-Session","ttl":300000000000,"bounded_load":1.25}`},
		{"sticky_ip", "sticky_ip {\n hash maglev\n table_size 65537\n ttl 1h\n}",
			`{"policy":"sticky_ip","hash":"maglev","table_size":65537,"ttl":3600000000000}`},
		{"sticky_ip bare", "sticky_ip", `{"policy":"sticky_ip"}`},
		{"weighted_least_conn positional", "weighted_least_conn 3 1", `{"policy":"weighted_least_conn","weights":[3,1]}`},
		{"weighted_least_conn block", "weighted_least_conn {\n weight 127.0.0.1:9001 5\n slow_start 30s\n aggression 2\n min_weight_percent 5\n clocks c1\n}",
			`{"policy":"weighted_least_conn","weights_by_address":{"127.0.0.1:9001":5},"slow_start":30000000000,"aggression":2,"min_weight_percent":5,"clocks":"c1"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := adapt(t, tc.policy)
			if err != nil {
				t.Fatal(err)
			}
			var want map[string]any
			if err := json.Unmarshal([]byte(tc.want), &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				g, _ := json.Marshal(got)
				t.Fatalf("got  %s\nwant %s", g, tc.want)
			}
		})
	}
}

func TestAdaptErrors(t *testing.T) {
	cases := []struct{ name, policy, want string }{
		{"cookie extra arg", "sticky_cookie a b", "wrong argument count"},
		{"cookie unknown", "sticky_cookie {\n sekret x\n}", `unknown subdirective "sekret"`},
		{"cookie secret twice", "sticky_cookie {\n secret a\n secret b\n}", "secret already specified"},
		{"cookie secret empty", "sticky_cookie {\n secret\n}", "wrong argument count"},
		{"cookie bad ttl", "sticky_cookie {\n ttl soon\n}", `invalid duration "soon"`},
		{"cookie negative ttl", "sticky_cookie {\n ttl -5m\n}", "must be positive"},
		{"cookie format", "sticky_cookie {\n format json\n}", `format: "json"`},
		{"cookie secure", "sticky_cookie {\n secure maybe\n}", `secure: "maybe"`},
		{"cookie http_only", "sticky_cookie {\n http_only perhaps\n}", `http_only: "perhaps"`},
		{"cookie same_site", "sticky_cookie {\n same_site loose\n}", `same_site: "loose"`},
		{"cookie fallback missing", "sticky_cookie {\n fallback\n}", "wrong argument count"},
		{"cookie fallback unknown", "sticky_cookie {\n fallback nosuch\n}", "nosuch"},
		{"cookie fallback twice", "sticky_cookie {\n fallback random\n fallback first\n}", "already specified"},
		{"cookie name two args", "sticky_cookie {\n name a b\n}", "wrong argument count"},
		{"app_cookie no name", "app_cookie", "want the application's cookie name"},
		{"app_cookie mode", "app_cookie J {\n mode steal\n}", `mode: "steal"`},
		{"app_cookie unknown", "app_cookie J {\n query x\n}", `unknown subdirective "query"`},
		{"app_cookie max_sessions", "app_cookie J {\n max_sessions 0\n}", "below 1"},
		{"app_cookie max_new_per_client", "app_cookie J {\n max_new_per_client 0\n}", "want a number from 1 to 65535, or off"},
		{"app_cookie max_new_per_client words", "app_cookie J {\n max_new_per_client many\n}", "want a number from 1 to 65535, or off"},
		{"url no key", "sticky_url", "exactly one of query, path_segment and suffix"},
		{"url two keys", "sticky_url {\n query a\n suffix ;x=\n}", "exactly one"},
		{"url arg", "sticky_url sid", "takes no arguments"},
		{"url segment", "sticky_url {\n path_segment two\n}", "invalid index"},
		{"url hash", "sticky_url {\n query a\n hash crc\n}", `hash: "crc"`},
		{"url table_size", "sticky_url {\n query a\n table_size big\n}", "invalid number"},
		{"header no name", "sticky_header", "want one header name"},
		{"header unknown", "sticky_header X {\n name y\n}", `unknown subdirective "name"`},
		{"ip arg", "sticky_ip 1", "wrong argument count"},
		{"ip unknown", "sticky_ip {\n query a\n}", `unknown subdirective "query"`},
		{"wlc weight", "weighted_least_conn x", `invalid weight "x"`},
		{"wlc negative", "weighted_least_conn 1 -2", "must not be negative"},
		{"wlc weight args", "weighted_least_conn {\n weight 127.0.0.1:9001\n}", "want <upstream address> <weight>"},
		{"wlc weight twice", "weighted_least_conn {\n weight a 1\n weight a 2\n}", "already has a weight"},
		{"wlc aggression", "weighted_least_conn {\n aggression 0\n}", "must be above 0"},
		{"wlc min_weight_percent", "weighted_least_conn {\n min_weight_percent 150\n}", "outside 0..100"},
		{"wlc slow_start", "weighted_least_conn {\n slow_start fast\n}", "invalid duration"},
		{"wlc unknown", "weighted_least_conn {\n ttl 1m\n}", `unknown subdirective "ttl"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := adapt(t, tc.policy)
			if err == nil {
				t.Fatalf("accepted lb_policy %s", tc.policy)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "Caddyfile:") {
				t.Fatalf("error %q does not name the file and line", err)
			}
		})
	}
}

func TestAdaptHandlerDirective(t *testing.T) {
	src := ":8080 {\n\tstickylb extra\n\treverse_proxy 127.0.0.1:9001\n}\n"
	if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": "Caddyfile"}); err == nil || !strings.Contains(err.Error(), "Caddyfile:2") {
		t.Fatalf("stickylb with an argument: %v", err)
	}
	// The handler sorts before reverse_proxy wherever it is written.
	src = ":8080 {\n\treverse_proxy 127.0.0.1:9001\n\tstickylb\n}\n"
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if i, j := strings.Index(s, `"handler":"stickylb"`), strings.Index(s, `"handler":"reverse_proxy"`); i < 0 || j < 0 || i > j {
		t.Fatalf("stickylb not ordered before reverse_proxy: %s", s)
	}
}

// validateCaddyfile adapts src and provisions it as Caddy would, without serving.
func validateCaddyfile(t *testing.T, src string) error {
	t.Helper()
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	var cfg caddy.Config
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	return caddy.Validate(&cfg)
}

// TestSharedTableNeedsOneSetting: handlers naming one table must agree on ttl and bound
// (max_sessions); either conflict fails the config.
func TestSharedTableNeedsOneSetting(t *testing.T) {
	for _, policy := range []struct{ head, extra string }{
		{"sticky_header X-S", ""},
		{"app_cookie JSESSIONID", "\t\t\tmode learn\n"},
	} {
		t.Run(strings.Fields(policy.head)[0], func(t *testing.T) {
			site := func(port int, ttl string, bound int) string {
				return fmt.Sprintf(":%d {\n\tstickylb\n\treverse_proxy 127.0.0.1:9001 {\n\t\tlb_policy %s {\n%s\t\t\ttable shared\n\t\t\tttl %s\n\t\t\tmax_sessions %d\n\t\t}\n\t}\n}\n",
					port, policy.head, policy.extra, ttl, bound)
			}
			if err := validateCaddyfile(t, site(18081, "10m", 5000)+site(18082, "10m", 5000)); err != nil {
				t.Fatalf("one table, one ttl and bound: %v", err)
			}
			for what, cfg := range map[string]string{
				"two ttls":   site(18081, "10m", 5000) + site(18082, "20m", 5000),
				"two bounds": site(18081, "10m", 5000) + site(18082, "10m", 9000),
			} {
				err := validateCaddyfile(t, cfg)
				if err == nil || !strings.Contains(err.Error(), "different settings") {
					t.Errorf("one table, %s: %v", what, err)
				}
			}
		})
	}
}
