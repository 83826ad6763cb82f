package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const (
	alertsPath     = "../../examples/prometheus/alerts.yaml"
	alertTestsPath = "../../examples/prometheus/alerts_test.yaml"
)

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	raw, err := os.ReadFile(alertsPath)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string      `yaml:"name"`
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatalf("%s: %v", alertsPath, err)
	}
	var rules []alertRule
	for _, g := range file.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

// Every alert is one an operator can act on: a severity, a summary and a runbook line; and
// the alerts cover what the fleet's operators asked for, tier by tier.
func TestAlertsAreActionable(t *testing.T) {
	rules := alertRules(t)
	var names []string
	for _, r := range rules {
		names = append(names, r.Alert)
		if r.Alert == "" || r.Expr == "" {
			t.Errorf("a rule without alert or expr: %+v", r)
		}
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
		}
		for _, a := range []string{"summary", "description", "runbook"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		if strings.Contains(r.Annotations["runbook"], "\n") {
			t.Errorf("%s: the runbook is one line", r.Alert)
		}
	}
	for _, want := range []string{"StickylbControlPlaneStoreLost", "StickylbControlPlaneNoLeader", "StickylbNodeDisconnected",
		"StickylbServicePanic", "StickylbNACKs", "StickylbBGPPeerDown", "StickylbNATPortsExhausted", "StickylbConnInsertsRefused",
		"StickylbTunnelNoRoute", "StickylbBackendRefusesTunnel"} {
		if !slices.Contains(names, want) {
			t.Errorf("no alert %s", want)
		}
	}
}

// Every metric an alert reads is one a tier exports (or is listed in pendingMetrics): a
// renamed metric fails here, not as an alert that never fires.
func TestAlertsMetricsExported(t *testing.T) {
	exported := exportedMetrics(t)
	seen := map[string]bool{}
	for _, r := range alertRules(t) {
		ms := promQLMetrics(r.Expr)
		if len(ms) == 0 {
			t.Errorf("%s: no metric in %q", r.Alert, r.Expr)
		}
		for _, m := range ms {
			seen[m] = true
		}
	}
	queried := make([]string, 0, len(seen))
	for m := range seen {
		queried = append(queried, m)
	}
	sort.Strings(queried)
	checkQueried(t, "alerts.yaml", queried, exported)
}

// promtool, the rules' consumer, accepts the file, and its unit tests pass: every alert fires
// on synthetic series that meet its condition and is silent on those that do not (each alert
// has both kinds of case in alerts_test.yaml).
func TestAlertsPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (scripts/test.sh installs Debian's prometheus package)")
	}
	fires, silent := alertCases(t)
	for _, r := range alertRules(t) {
		if !fires[r.Alert] || !silent[r.Alert] {
			t.Errorf("%s: alerts_test.yaml has a case where it fires: %v, where it is silent: %v", r.Alert, fires[r.Alert], silent[r.Alert])
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := filepath.Dir(alertsPath)
	for _, args := range [][]string{{"check", "rules", filepath.Base(alertsPath)}, {"test", "rules", filepath.Base(alertTestsPath)}} {
		cmd := exec.CommandContext(ctx, promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// alertCases reads which alerts alerts_test.yaml expects to fire at some evaluation, and
// which it expects silent at some other.
func alertCases(t *testing.T) (fires, silent map[string]bool) {
	t.Helper()
	raw, err := os.ReadFile(alertTestsPath)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatalf("%s: %v", alertTestsPath, err)
	}
	fires, silent = map[string]bool{}, map[string]bool{}
	for _, tc := range file.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	return fires, silent
}
