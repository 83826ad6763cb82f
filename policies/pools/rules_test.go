package pools

import (
	"fmt"
	"strings"
	"testing"
)

// TestEveryRule is the table of bad files: one case per validation rule, each with the
// position ("line:col", or "line" alone where YAML gives no column, or "" for the whole
// file) and the start of the message it must report. A case lists the one error it is
// about; the file may hold no other.
func TestEveryRule(t *testing.T) {
	// svc is a service "s" whose fields start at line 3, column 5.
	svc := func(body string) string { return "services:\n  - name: s\n" + body }
	http := func(body string) string { return svc("    protocol: http\n" + body) }
	one := "    backends: [{address: 10.0.0.1:80}]\n"
	cases := []struct{ name, src, at, msg string }{
		// The document.
		{"empty", "", "", "empty pools file"},
		{"null document", "~\n", "1:1", "empty pools file"},
		{"two documents", "services: []\n---\nservices: []\n", "2:1", "a pools file holds one YAML document"},
		{"syntax", "services:\n  - name: [\n", "2", "YAML: "},
		{"not a mapping", "[1, 2]\n", "1:1", "the pools file: want a mapping, got a list"},
		{"no services", "{}\n", "1:1", "services: is required"},
		{"services not a list", "services: web\n", "1:11", "services: want a list, got string \"web\""},
		{"unknown top-level field", "services: []\nservice: []\n", "2:1", "unknown field \"service\" in the pools file (did you mean \"services\"?)"},
		{"alias bomb", aliasBomb, "3:10", "pools file expands to more than 4194304 nodes through aliases"},
		// Mappings and keys.
		{"unknown field", http("    balnce: maglev\n" + one), "4:5", "unknown field \"balnce\" in service (did you mean \"balance\"?)"},
		{"duplicate key", http("    protocol: tcp\n" + one), "4:5", "duplicate key \"protocol\" (first at line 3)"},
		{"key not a name", http("    [a]: 1\n" + one), "4:5", "a mapping key must be a field name, got a list"},
		{"merge cycle", "services:\n  - &s\n    <<: *s\n    name: s\n    protocol: http\n" + one, "3:9", "merge key (<<) refers to the mapping it is part of"},
		{"merge list of scalars", http("    <<: [1]\n" + one), "4:10", "merge key (<<) list entries must be mappings, got integer 1"},
		{"merge scalar", http("    <<: 1\n" + one), "4:9", "merge key (<<) wants a mapping or a list of mappings, got integer 1"},
		{"service not a mapping", "services: [web]\n", "1:12", "service: want a mapping, got string \"web\""},
		// Scalar types.
		{"string wanted", http("    listen: [1]\n" + one), "4:13", "listen: want a string, got a list"},
		{"boolean as string", svc("    protocol: true\n" + one), "3:15", "protocol: want a string, got boolean true (quote it if you mean the text)"},
		{"null value", svc("    protocol:\n" + one), "3:14", "protocol: want a string, got no value"},
		{"integer wanted", http(one[:len(one)-3] + ", weight: \"3\"}]\n"), "4:47", "weight: want an integer, got string \"3\""},
		{"integer too big", http(one[:len(one)-3] + ", weight: !!int 99999999999999999999}]\n"), "4:47", "weight: integer 99999999999999999999 does not fit in 64 bits"},
		{"number wanted", http("    slow_start: {window: 1s, aggression: fast}\n" + one), "4:42", "aggression: want a number, got string \"fast\""},
		{"number not finite", http("    slow_start: {window: 1s, aggression: .nan}\n" + one), "4:42", "aggression: want a finite number, got .nan"},
		{"boolean wanted", http("    cross_zone: 1\n" + one), "4:17", "cross_zone: want true or false, got integer 1"},
		{"yes is not a boolean", http("    cross_zone: yes\n" + one), "4:17", "cross_zone: want true or false, got string \"yes\""},
		{"duration without unit", http("    affinity: {mode: cookie, ttl: 30}\n" + one), "4:35", "ttl: 30 has no unit; write a duration such as 30s or 30m"},
		{"duration quoted without unit", http("    affinity: {mode: cookie, ttl: \"30\"}\n" + one), "4:35", "ttl: \"30\" has no unit"},
		{"duration of a list", http("    affinity: {mode: cookie, ttl: [1]}\n" + one), "4:35", "ttl: want a duration such as 30s, got a list"},
		{"bad duration", http("    affinity: {mode: cookie, ttl: 30 minutes}\n" + one), "4:35", "ttl: bad duration \"30 minutes\""},
		// Service fields.
		{"bad name", "services:\n  - {name: Web_1, protocol: http, backends: [{address: 10.0.0.1:80}]}\n", "2:12", "name \"Web_1\": want lowercase letters"},
		{"no name", "services:\n  - {protocol: http, backends: [{address: 10.0.0.1:80}]}\n", "2:5", "service: name is required"},
		{"duplicate name", "services:\n  - {name: s, protocol: http, backends: [{address: 10.0.0.1:80}]}\n  - {name: s, protocol: http, backends: [{address: 10.0.0.1:80}]}\n", "3:12", "service name \"s\" already used at line 2"},
		{"bad protocol", svc("    protocol: ftp\n" + one), "3:15", "protocol \"ftp\": want http, grpc, tcp or udp"},
		{"no protocol", svc(one), "2:5", "service s: protocol is required"},
		{"listen host name", http("    listen: web.local:80\n" + one), "4:13", "listen \"web.local:80\": want ip:port (an IP address, not a host name"},
		{"listen not ip:port", http("    listen: 80\n" + one), "4:13", "listen \"80\": want ip:port (e.g."},
		{"listen port out of range", http("    listen: 10.0.0.1:70000\n" + one), "4:13", "listen \"10.0.0.1:70000\": port 70000 out of range 1..65535"},
		{"port beyond 64 bits", http("    listen: \"[::1]:99999999999999999999\"\n" + one), "4:13", "listen \"[::1]:99999999999999999999\": port 99999999999999999999 out of range 1..65535"},
		{"port not a number", http("    listen: 10.0.0.1:http\n" + one), "4:13", "listen \"10.0.0.1:http\": port \"http\" is not a number"},
		{"no port", http("    listen: \"10.0.0.1:\"\n" + one), "4:13", "listen \"10.0.0.1:\": no port after the address"},
		{"port 0", http("    listen: 127.0.0.1:0\n" + one), "4:13", "listen \"127.0.0.1:0\": port 0 is not a port"},
		{"ipv6 zone", http("    listen: \"[fe80::1%eth0]:80\"\n" + one), "4:13", "listen \"[fe80::1%eth0]:80\": IPv6 zones are not supported"},
		{"multicast", http("    listen: 224.0.0.1:80\n" + one), "4:13", "listen \"224.0.0.1:80\": a multicast address"},
		{"unspecified vip", svc("    protocol: tcp\n    vip: 0.0.0.0:80\n" + one), "4:10", "vip \"0.0.0.0:80\": an unspecified address (0.0.0.0 or ::) is not a VIP"},
		{"ipv4-mapped", http("    listen: \"[::ffff:10.0.0.1]:80\"\n" + one), "4:13", "listen \"[::ffff:10.0.0.1]:80\": write the IPv4 address as IPv4 (10.0.0.1:80)"},
		{"vip on http", http("    vip: 10.9.9.9:80\n" + one), "4:5", "vip applies to tcp and udp services"},
		{"tcp needs listen or vip", svc("    protocol: tcp\n" + one), "2:5", "service s: a tcp service needs listen"},
		{"duplicate listen", "services:\n  - {name: a, protocol: http, listen: 0.0.0.0:80, backends: [{address: 10.0.0.1:80}]}\n  - {name: b, protocol: tcp, listen: 0.0.0.0:80, backends: [{address: 10.0.0.1:80}]}\n", "3:38", "listen 0.0.0.0:80 already used by service a at line 2"},
		{"duplicate vip", "services:\n  - {name: a, protocol: tcp, vip: 10.9.9.9:80, backends: [{address: 10.0.0.1:80}]}\n  - {name: b, protocol: tcp, vip: 10.9.9.9:80, backends: [{address: 10.0.0.1:80}]}\n", "3:35", "vip 10.9.9.9:80/tcp already used by service a at line 2"},
		{"vip hosts differ", "services:\n  - {name: a, protocol: tcp, vip: 10.9.9.9:80, backends: [{address: 10.0.0.1:80}]}\n  - {name: b, protocol: tcp, vip: 10.9.9.9:81, backends: [{address: 10.0.0.2:81}]}\n", "3:35", "vip 10.9.9.9:81 shares address 10.9.9.9 (tcp) with service a at line 2 but not its backend hosts"},
		{"bad balance", http("    balance: magelv\n" + one), "4:14", "balance \"magelv\": want weighted_least_conn, weighted_round_robin, maglev or ring_hash (did you mean \"maglev\"?)"},
		{"bad drained zone", http("    drained_zones: [\"a b\"]\n" + one), "4:21", "drained zone \"a b\": want letters"},
		{"drained zone twice", http("    drained_zones: [a, a]\n" + one), "4:24", "drained zone \"a\" listed twice (first at line 4)"},
		{"no backends", http(""), "2:5", "service s: backends is required"},
		{"empty backends", http("    backends: []\n"), "4:15", "service s: backends is empty"},
		// Affinity.
		{"affinity without mode", http("    affinity: {ttl: 1m}\n" + one), "4:5", "affinity: mode is required"},
		{"bad mode", http("    affinity: {mode: cokie}\n" + one), "4:22", "affinity mode \"cokie\": want none, cookie, app_cookie, url, header, source_ip or quic_cid (did you mean \"cookie\"?)"},
		{"ttl under 1s", http("    affinity: {mode: cookie, ttl: 500ms}\n" + one), "4:35", "ttl 500ms: want at least 1s"},
		{"ttl fraction", http("    affinity: {mode: cookie, ttl: 1500ms}\n" + one), "4:35", "ttl 1.5s: want whole seconds"},
		{"max_sessions range", http("    affinity: {mode: cookie, max_sessions: 0}\n" + one), "4:44", "max_sessions 0 out of range 1..1073741824"},
		{"ttl with mode none", http("    affinity: {mode: none, ttl: 1m}\n" + one), "4:28", "affinity ttl has no effect with mode none"},
		{"cookie mode on tcp", svc("    protocol: tcp\n    listen: 0.0.0.0:1\n    affinity: {mode: cookie}\n" + one), "5:22", "affinity mode cookie needs HTTP; s is a tcp service (use none, source_ip)"},
		{"url on grpc", svc("    protocol: grpc\n    affinity: {mode: url, url: {query: sid}}\n    balance: ring_hash\n" + one), "4:22", "affinity mode url does not apply to grpc"},
		{"quic on tcp", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    affinity: {mode: quic_cid}\n    backends: [{address: 10.0.0.1:443}]\n"), "5:22", "affinity mode quic_cid applies to udp services with a vip"},
		{"block of another mode", http("    affinity: {mode: cookie, header: {name: x}}\n" + one), "4:30", "affinity header applies to mode header, not cookie"},
		{"mode needs its block", http("    affinity: {mode: url}\n" + one), "4:22", "affinity mode url needs an affinity.url block"},
		{"bad cookie name", http("    affinity: {mode: cookie, cookie: {name: \"a b\"}}\n" + one), "4:45", "cookie name \"a b\": want a cookie name"},
		{"bad cookie path", http("    affinity: {mode: cookie, cookie: {path: app}}\n" + one), "4:45", "cookie path \"app\": want an absolute path"},
		{"app_cookie without name", http("    affinity: {mode: app_cookie, app_cookie: {mode: prefix}}\n" + one), "4:34", "app_cookie: name is required"},
		{"bad app_cookie name", http("    affinity: {mode: app_cookie, app_cookie: {name: \"a;b\"}}\n" + one), "4:53", "app_cookie name \"a;b\": want a cookie name"},
		{"bad app_cookie mode", http("    affinity: {mode: app_cookie, app_cookie: {name: J, mode: keep}}\n" + one), "4:62", "app_cookie mode \"keep\": want prefix or learn"},
		{"bad url query", http("    affinity: {mode: url, url: {query: \"a=b\"}}\n    balance: ring_hash\n" + one), "4:40", "url query \"a=b\": want a query parameter name"},
		{"url segment range", http("    affinity: {mode: url, url: {path_segment: 9999999999}}\n    balance: ring_hash\n" + one), "4:47", "url path_segment 9999999999 out of range"},
		{"bad url suffix", http("    affinity: {mode: url, url: {suffix: \"\"}}\n    balance: ring_hash\n" + one), "4:41", "url suffix \"\": want a marker"},
		{"url without source", http("    affinity: {mode: url, url: {}}\n    balance: ring_hash\n" + one), "4:27", "url: set one of query, path_segment or suffix"},
		{"url two sources", http("    affinity: {mode: url, url: {query: a, suffix: b}}\n    balance: ring_hash\n" + one), "4:27", "url: set exactly one of query, path_segment or suffix, not query and suffix"},
		{"header without name", http("    affinity: {mode: header, header: {}}\n" + one), "4:30", "header: name is required"},
		{"bad header name", http("    affinity: {mode: header, header: {name: \"x y\"}}\n" + one), "4:45", "header name \"x y\": want an HTTP header name"},
		{"cid length range", svc("    protocol: udp\n    vip: 10.9.9.9:443\n    affinity: {mode: quic_cid, quic_cid: {cid_length: 2}}\n    backends: [{address: 10.0.0.1:443}]\n"), "5:55", "quic_cid cid_length 2 out of range 3..20"},
		// Balance and hash.
		{"keyed needs hash", http("    affinity: {mode: header, header: {name: x}}\n    balance: weighted_least_conn\n" + one), "5:14", "affinity header hashes its key, so balance must be maglev or ring_hash, not weighted_least_conn"},
		{"learn needs hash", http("    affinity: {mode: app_cookie, app_cookie: {name: J, mode: learn}}\n    balance: weighted_round_robin\n" + one), "5:14", "affinity app_cookie learn hashes its key"},
		{"vip balance", svc("    protocol: tcp\n    vip: 10.9.9.9:80\n    balance: ring_hash\n" + one), "5:14", "a vip service's balance is maglev, weighted_round_robin or weighted_least_conn"},
		{"vip source_ip needs maglev", svc("    protocol: tcp\n    vip: 10.9.9.9:80\n    affinity: {mode: source_ip}\n    balance: weighted_round_robin\n" + one), "6:14", "affinity source_ip hashes its key, so a vip service must use balance maglev, not weighted_round_robin"},
		{"vip quic_cid needs maglev", svc("    protocol: udp\n    vip: 10.9.9.9:443\n    affinity: {mode: quic_cid}\n    balance: weighted_least_conn\n    backends: [{address: 10.0.0.1:443}]\n"), "6:14", "affinity quic_cid hashes its key, so a vip service must use balance maglev"},
		{"vip wrr ring sizes", svc("    protocol: tcp\n    vip: 10.9.9.9:80\n    balance: weighted_round_robin\n    hash: {min_ring_size: 10}\n" + one), "6:12", "hash min_ring_size does not apply to a weighted_round_robin vip service"},
		{"vip wlc table too large", svc("    protocol: tcp\n    vip: 10.9.9.9:80\n    balance: weighted_least_conn\n    hash: {table_size: 131071}\n" + one), "6:24", "table_size 131071: a vip service's Maglev table holds at most 65537 slots"},
		{"hash without hashing", http("    balance: weighted_least_conn\n    hash: {min_ring_size: 10}\n" + one), "5:5", "hash applies to balance maglev and ring_hash, not weighted_least_conn"},
		{"table size with ring", http("    balance: ring_hash\n    hash: {table_size: 65537}\n" + one), "5:12", "hash table_size applies to balance maglev"},
		{"table size range", http("    balance: maglev\n    hash: {table_size: 1}\n" + one), "5:24", "table_size 1 out of range: want a prime up to 5000011"},
		{"table size not prime", http("    balance: maglev\n    hash: {table_size: 65536}\n" + one), "5:24", "table_size 65536 is not prime"},
		{"vip table too large", svc("    protocol: tcp\n    vip: 10.0.0.100:80\n    hash: {table_size: 131071}\n" + one), "5:24", "table_size 131071: a vip service's Maglev table holds at most 65537 slots"},
		{"idle timeout without vip", http("    idle_timeout: 60s\n" + one), "4:5", "idle_timeout applies to vip services"},
		{"idle timeout too short", svc("    protocol: tcp\n    vip: 10.0.0.100:80\n    idle_timeout: 500ms\n" + one), "5:19", "idle_timeout 500ms: want at least 1s"},
		{"table smaller than backends", http("    balance: maglev\n    hash: {table_size: 2}\n    backends: [{address: 10.0.0.1:80}, {address: 10.0.0.2:80}, {address: 10.0.0.3:80}]\n"), "5:24", "table_size 2 is smaller than the 3 backends"},
		{"ring size range", http("    balance: ring_hash\n    hash: {max_ring_size: 0}\n" + one), "5:27", "max_ring_size 0 out of range 1..8388608"},
		{"ring sizes crossed", http("    balance: ring_hash\n    hash: {min_ring_size: 5000, max_ring_size: 100}\n" + one), "5:27", "min_ring_size 5000 is larger than max_ring_size 100"},
		{"bounded load", http("    balance: ring_hash\n    hash: {bounded_load: 50}\n" + one), "5:26", "bounded_load 50: want 0 (off) or a percentage"},
		// Slow start.
		{"slow start without window", http("    slow_start: {aggression: 1}\n" + one), "4:5", "slow_start: window is required"},
		{"slow start negative window", http("    slow_start: {window: -1s}\n" + one), "4:26", "slow_start window -1s: want 0 or more"},
		{"slow start aggression", http("    slow_start: {window: 1s, aggression: 0}\n" + one), "4:42", "slow_start aggression 0: want more than 0"},
		{"slow start min weight", http("    slow_start: {window: 1s, min_weight_percent: 101}\n" + one), "4:50", "slow_start min_weight_percent 101 out of range 0..100"},
		{"slow start with hashing", http("    balance: maglev\n    slow_start: {window: 10s}\n" + one), "5:5", "slow_start applies to weighted_least_conn and weighted_round_robin (Envoy ramps only those), and to vip services with maglev"},
		// Health checks.
		{"bad health protocol", http("    health_check: {protocol: udp}\n" + one), "4:30", "health_check protocol \"udp\": want http, tcp or icmp"},
		{"bad health path", http("    health_check: {path: healthz}\n" + one), "4:26", "health_check path \"healthz\": want an absolute path"},
		{"expect_status range", http("    health_check: {expect_status: [99]}\n" + one), "4:36", "expect_status 99: want an HTTP status 100..599"},
		{"expect_status twice", http("    health_check: {expect_status: [200, 200]}\n" + one), "4:41", "expect_status 200 listed twice"},
		{"expect_status empty", http("    health_check: {expect_status: []}\n" + one), "4:35", "expect_status is empty"},
		{"health port range", http("    health_check: {port: 70000}\n" + one), "4:26", "health_check port 70000 out of range 1..65535"},
		{"interval range", http("    health_check: {interval: 500ms}\n" + one), "4:30", "health_check interval 500ms out of range 1s..5m0s"},
		{"timeout not positive", http("    health_check: {timeout: -1s}\n" + one), "4:29", "health_check timeout -1s: want more than 0"},
		{"timeout over interval", http("    health_check: {interval: 1s, timeout: 3s}\n" + one), "4:43", "health_check timeout 3s must be shorter than the interval 1s"},
		{"timeout equal to interval", http("    health_check: {interval: 2s, timeout: 2s}\n" + one), "4:43", "health_check timeout 2s must be shorter than the interval 2s"},
		{"threshold range", http("    health_check: {healthy_threshold: 0}\n" + one), "4:39", "health_check healthy_threshold 0 out of range 1..1000"},
		{"path on tcp check", http("    health_check: {protocol: tcp, path: /h}\n" + one), "4:35", "health_check path applies to http checks, not tcp"},
		{"port on icmp check", http("    health_check: {protocol: icmp, port: 80}\n" + one), "4:36", "health_check port does not apply to icmp checks"},
		// Backends.
		{"backend not a mapping", http("    backends: [10.0.0.1:80]\n"), "4:16", "backend: want a mapping, got string \"10.0.0.1:80\""},
		{"backend without address", http("    backends: [{weight: 1}]\n"), "4:16", "backend: address is required"},
		{"backend host name", http("    backends: [{address: \"web.local:80\"}]\n"), "4:26", "address \"web.local:80\": want ip:port (an IP address, not a host name"},
		{"backend port out of range", http("    backends: [{address: \"10.0.0.1:65536\"}]\n"), "4:26", "address \"10.0.0.1:65536\": port 65536 out of range 1..65535"},
		{"backend unspecified", http("    backends: [{address: 0.0.0.0:80}]\n"), "4:26", "address \"0.0.0.0:80\": an unspecified address (0.0.0.0 or ::) is not a backend"},
		{"weight 0", http("    backends: [{address: 10.0.0.1:80, weight: 0}]\n"), "4:47", "weight 0: want 1..10000; to stop new sessions to a backend, set drain: true"},
		{"weight too big", http("    backends: [{address: 10.0.0.1:80, weight: 10001}]\n"), "4:47", "weight 10001 out of range 1..10000"},
		{"bad zone", http("    backends: [{address: 10.0.0.1:80, zone: \"a b\"}]\n"), "4:45", "zone \"a b\": want letters"},
		{"bad hash_key", http("    backends: [{address: 10.0.0.1:80, hash_key: \"a b\"}]\n"), "4:49", "hash_key \"a b\": want 1..255 printable characters"},
		{"server_id range", svc("    protocol: udp\n    vip: 10.9.9.9:443\n    affinity: {mode: quic_cid}\n    backends: [{address: 10.0.0.1:443, server_id: 0}]\n"), "6:51", "server_id 0 out of range 1..65535"},
		{"server_id twice", svc("    protocol: udp\n    vip: 10.9.9.9:443\n    affinity: {mode: quic_cid}\n    backends: [{address: 10.0.0.1:443, server_id: 1}, {address: 10.0.0.2:443, server_id: 1}]\n"), "6:90", "server_id 1 already used at line 6"},
		{"bad mac", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    backends: [{address: 10.0.0.1:443, mac: \"02:00:00\"}]\n"), "5:45", "mac \"02:00:00\": want six hex pairs"},
		{"multicast mac", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    backends: [{address: 10.0.0.1:443, mac: \"01:00:5e:00:00:01\"}]\n"), "5:45", "mac \"01:00:5e:00:00:01\": a multicast or broadcast address"},
		{"mac without vip", http("    backends: [{address: 10.0.0.1:80, mac: \"02:00:00:00:00:01\"}]\n"), "4:44", "backend mac applies to vip services"},
		{"address twice", http("    backends:\n      - {address: 10.0.0.1:80}\n      - {address: 10.0.0.1:80, hash_key: x}\n"), "6:9", "backend 10.0.0.1:80: address listed twice in service s (first at line 5)"},
		{"identity twice", http("    backends:\n      - {address: 10.0.0.1:80, hash_key: k}\n      - {address: 10.0.0.2:80, hash_key: k}\n"), "6:9", "backend 10.0.0.2:80: identity \"k\" already used at line 5"},
		{"vip port differs under dr", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    forwarding: dr\n    backends: [{address: 10.0.0.1:8443}]\n"), "6:26", "backend 10.0.0.1:8443: port 8443 differs from the vip's 443, and direct routing (forwarding: dr) keeps the port; use forwarding: nat or auto, or listen on 443"},
		{"vip port differs under the backend's dr", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    forwarding: nat\n    backends: [{address: 10.0.0.1:8443, forwarding: dr}]\n"), "6:26", "backend 10.0.0.1:8443: port 8443 differs from the vip's 443, and direct routing (forwarding: dr) keeps the port; use forwarding: nat or auto"},
		{"bad forwarding", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    forwarding: nta\n    backends: [{address: 10.0.0.1:443}]\n"), "5:17", "forwarding \"nta\": want auto, dr, nat or tunnel (did you mean \"nat\"?)"},
		{"forwarding in capitals", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    forwarding: DR\n    backends: [{address: 10.0.0.1:443}]\n"), "5:17", "forwarding \"DR\": want auto, dr, nat or tunnel (did you mean \"dr\"?)"},
		{"forwarding not a string", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    forwarding: [nat]\n    backends: [{address: 10.0.0.1:443}]\n"), "5:17", "forwarding: want a string, got a list"},
		{"bad backend forwarding", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    backends: [{address: 10.0.0.1:443, forwarding: snat}]\n"), "5:52", "forwarding \"snat\": want auto, dr, nat or tunnel (did you mean \"nat\"?)"},
		{"forwarding without vip", svc("    protocol: tcp\n    listen: 0.0.0.0:443\n    forwarding: nat\n    backends: [{address: 10.0.0.1:443}]\n"), "5:5", "forwarding applies to vip services"},
		{"backend forwarding without vip", http("    backends: [{address: 10.0.0.1:80, forwarding: nat}]\n"), "4:51", "backend forwarding applies to vip services"},
		{"backend tunnel", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    backends: [{address: 10.0.0.1:443, forwarding: tunnel}]\n"), "5:52", "backend 10.0.0.1:443: forwarding tunnel is a service's, for all its backends"},
		{"backend forwarding in a tunnel service", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    forwarding: tunnel\n    backends: [{address: 10.0.0.1:443, forwarding: dr}]\n"), "6:52", "backend 10.0.0.1:443: service s forwards every backend by tunnel"},
		{"vip port differs under tunnel", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    forwarding: tunnel\n    backends: [{address: 10.0.0.1:8443}]\n"), "6:26", "backend 10.0.0.1:8443: port 8443 differs from the vip's 443, and the tunnel carries the client's packet unchanged"},
		{"tunnel_port range", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    forwarding: tunnel\n    tunnel_port: 0\n    backends: [{address: 10.0.0.1:443}]\n"), "6:18", "tunnel_port 0 out of range 1..65535"},
		{"tunnel_port without tunnel", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    tunnel_port: 6080\n    backends: [{address: 10.0.0.1:443}]\n"), "5:5", "tunnel_port applies to forwarding: tunnel, and service s forwards by auto"},
		{"second_chance without vip", svc("    protocol: tcp\n    listen: 0.0.0.0:443\n    second_chance: false\n    backends: [{address: 10.0.0.1:443}]\n"), "5:5", "second_chance applies to vip services with forwarding: tunnel"},
		{"second_chance not a boolean", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    forwarding: tunnel\n    second_chance: no\n    backends: [{address: 10.0.0.1:443}]\n"), "6:20", "second_chance: want true or false"},
		{"tunnel on one port of a vip address", "services:\n  - {name: a, protocol: tcp, vip: 10.9.9.9:80, forwarding: tunnel, backends: [{address: 10.0.0.1:80}]}\n  - {name: b, protocol: tcp, vip: 10.9.9.9:81, backends: [{address: 10.0.0.1:81}]}\n", "3:35", "vip 10.9.9.9:81 shares address 10.9.9.9 (tcp) with service a at line 2, and only one of them forwards by tunnel"},
		{"vip family differs", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    backends: [{address: \"[2001:db8::1]:443\"}]\n"), "5:26", "backend [2001:db8::1]:443: not the vip's address family (10.9.9.9)"},
		{"drain not boolean", http("    backends: [{address: 10.0.0.1:80, drain: 1}]\n"), "4:46", "drain: want true or false, got integer 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.src)
			}
			want := "p.yaml: " + tc.msg
			if tc.at != "" {
				want = "p.yaml:" + tc.at + ": " + tc.msg
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if strings.HasPrefix(line, want) {
					return
				}
			}
			t.Fatalf("no error starting %q in:\n%s\nfile:\n%s", want, err, tc.src)
		})
	}
}

// TestEveryWarning: the legal settings that likely do not do what the operator expects.
func TestEveryWarning(t *testing.T) {
	cases := []struct{ name, src, at, msg string }{
		{"grpc maglev", "services:\n  - {name: g, protocol: grpc, balance: maglev, backends: [{address: 10.0.0.1:80}]}\n", "2:40", "gRPC clients have no Maglev"},
		{"grpc weights", "services:\n  - {name: g, protocol: grpc, balance: weighted_least_conn, backends: [{address: 10.0.0.1:80, weight: 2}, {address: 10.0.0.2:80}]}\n", "2:40", "gRPC's least_request ignores endpoint weights"},
		{"grpc big ring", "services:\n  - {name: g, protocol: grpc, balance: ring_hash, hash: {max_ring_size: 8192}, backends: [{address: 10.0.0.1:80}]}\n", "2:73", "gRPC caps rings at 4096 entries"},
		{"server_id outside quic", "services:\n  - {name: g, protocol: http, backends: [{address: 10.0.0.1:80, server_id: 1}]}\n", "2:76", "server_id is read only in affinity mode quic_cid"},
		{"drained zone without backends", "services:\n  - {name: g, protocol: http, drained_zones: [z], backends: [{address: 10.0.0.1:80, zone: a}]}\n", "2:46", "drained zone \"z\": no backend of g is in it"},
		{"mac of a nat backend", "services:\n  - {name: g, protocol: tcp, vip: 10.9.9.9:80, forwarding: nat, backends: [{address: 10.0.0.1:80, mac: \"02:00:00:00:00:01\"}]}\n", "2:104", "backend 10.0.0.1:80: mac is not used by NAT forwarding"},
		{"mac of a tunnel backend", "services:\n  - {name: g, protocol: tcp, vip: 10.9.9.9:80, forwarding: tunnel, backends: [{address: 10.0.0.1:80, mac: \"02:00:00:00:00:01\"}]}\n", "2:107", "backend 10.0.0.1:80: mac is not used by tunnel forwarding"},
		{"tunnel beside a listener", "services:\n  - {name: g, protocol: tcp, vip: 10.9.9.9:80, listen: 0.0.0.0:80, forwarding: tunnel, backends: [{address: 10.0.0.1:80}]}\n", "2:68", "forwarding tunnel builds the vip's table by rendezvous hashing"},
		{"second chance under round robin", "services:\n  - {name: g, protocol: tcp, vip: 10.9.9.9:80, balance: weighted_round_robin, forwarding: tunnel, backends: [{address: 10.0.0.1:80}]}\n", "2:57", "second chance covers flows the vip's table placed"},
		{"everything drained", "services:\n  - {name: g, protocol: http, drained_zones: [a], backends: [{address: 10.0.0.1:80, zone: a}]}\n", "2:46", "every backend of g is drained"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse("w.yaml", []byte(tc.src))
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			want := "w.yaml:" + tc.at + ": " + tc.msg
			for _, line := range strings.Split(f.Warnings.Error(), "\n") {
				if strings.HasPrefix(line, want) {
					return
				}
			}
			t.Fatalf("no warning starting %q in:\n%s", want, f.Warnings)
		})
	}
}

// aliasBomb merges (<<) ten copies of the mapping before it into each service: the seventh
// service names the first one 10^7 times.
var aliasBomb = func() string {
	var b strings.Builder
	b.WriteString("services:\n  - &m0 {name: a, protocol: http, backends: [{address: 10.0.0.1:80}]}\n")
	for i := 1; i <= 7; i++ {
		fmt.Fprintf(&b, "  - &m%d {<<: [%s]}\n", i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*m%d, ", i-1), 10), ", "))
	}
	return b.String()
}()
