// Package kubernetes holds the manifests of deploy/kubernetes and, in this test, their checks:
// no live cluster runs here, so every document is decoded strictly into the Kubernetes API
// types (an unknown or duplicate field is an error, as `kubectl apply --validate=strict`
// makes it), and what the API server would not catch either is checked across documents
// (selectors, ports, ConfigMap and Secret references), with the files the pods read handed to
// their consumers (the pools file to its parser, the Caddyfile to Caddy's adapter). The
// Kubernetes modules are imported by this test only: no binary links them.
package kubernetes

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	_ "github.com/stickylb/stickylb/caddymodule"
	"github.com/stickylb/stickylb/policies/pools"
)

// object is one decoded document and where it came from.
type object struct {
	where string
	obj   runtime.Object
}

// decodeAll decodes every document of every manifest strictly.
func decodeAll(t *testing.T) []object {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, policyv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	decoder := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var out []object
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
		for i := 1; ; i++ {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: document %d: %v", f, i, err)
			}
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			obj, _, err := decoder.Decode(doc, nil, nil)
			if err != nil {
				t.Errorf("%s: document %d: %v", f, i, err)
				continue
			}
			out = append(out, object{where: f, obj: obj})
		}
	}
	return out
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.Bytes()
}

// The decoder is strict: a field the API does not have fails, as does one written twice.
func TestStrictDecoderRefusesUnknownFields(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	decoder := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	for _, doc := range []string{
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: v}\nextra: 1\n",
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, name: b}\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 80, tragetPort: 8080}]}\n",
	} {
		if _, _, err := decoder.Decode([]byte(doc), nil, nil); err == nil {
			t.Errorf("decoded without error:\n%s", doc)
		}
	}
}

// workload is a Deployment, StatefulSet, DaemonSet or Job: its pod template and selector.
type workload struct {
	kind, name string
	selector   map[string]string
	pod        corev1.PodTemplateSpec
}

type manifests struct {
	workloads  []workload
	services   []*corev1.Service
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
	pdbs       []*policyv1.PodDisruptionBudget
}

func load(t *testing.T) manifests {
	t.Helper()
	m := manifests{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	for _, o := range decodeAll(t) {
		switch v := o.obj.(type) {
		case *corev1.Namespace:
			if v.Name != "stickylb" {
				t.Errorf("%s: namespace %s", o.where, v.Name)
			}
			continue
		case *appsv1.Deployment:
			m.workloads = append(m.workloads, workload{"Deployment", v.Name, v.Spec.Selector.MatchLabels, v.Spec.Template})
		case *appsv1.StatefulSet:
			m.workloads = append(m.workloads, workload{"StatefulSet", v.Name, v.Spec.Selector.MatchLabels, v.Spec.Template})
		case *appsv1.DaemonSet:
			m.workloads = append(m.workloads, workload{"DaemonSet", v.Name, v.Spec.Selector.MatchLabels, v.Spec.Template})
		case *batchv1.Job:
			m.workloads = append(m.workloads, workload{"Job", v.Name, v.Spec.Template.Labels, v.Spec.Template})
		case *corev1.Service:
			m.services = append(m.services, v)
		case *corev1.ConfigMap:
			m.configMaps[v.Name] = v
		case *corev1.Secret:
			m.secrets[v.Name] = v
		case *policyv1.PodDisruptionBudget:
			m.pdbs = append(m.pdbs, v)
		default:
			t.Errorf("%s: a %T the checks below do not cover", o.where, v)
			continue
		}
		if ns := o.obj.(interface{ GetNamespace() string }).GetNamespace(); ns != "stickylb" {
			t.Errorf("%s: %T in namespace %q, want stickylb", o.where, o.obj, ns)
		}
	}
	return m
}

func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// What an API server and a kubelet would find wrong across documents: selectors that select
// nothing, ports and references that name nothing, containers that run with more than they
// need.
func TestManifestsHangTogether(t *testing.T) {
	m := load(t)
	if len(m.workloads) < 5 {
		t.Fatalf("found %d workloads", len(m.workloads))
	}
	for _, w := range m.workloads {
		if !matches(w.selector, w.pod.Labels) {
			t.Errorf("%s %s: selector %v does not select its own pods %v", w.kind, w.name, w.selector, w.pod.Labels)
		}
		spec := w.pod.Spec
		for _, v := range spec.Volumes {
			switch {
			case v.ConfigMap != nil && m.configMaps[v.ConfigMap.Name] == nil:
				t.Errorf("%s %s: volume %s: no ConfigMap %s", w.kind, w.name, v.Name, v.ConfigMap.Name)
			case v.Secret != nil && m.secrets[v.Secret.SecretName] == nil:
				t.Errorf("%s %s: volume %s: no Secret %s", w.kind, w.name, v.Name, v.Secret.SecretName)
			}
		}
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			for _, e := range c.Env {
				if ref := e.ValueFrom; ref != nil && ref.ConfigMapKeyRef != nil {
					cm := m.configMaps[ref.ConfigMapKeyRef.Name]
					if _, ok := cm.Data[ref.ConfigMapKeyRef.Key]; cm == nil || !ok {
						t.Errorf("%s %s: env %s: no key %s in ConfigMap %s", w.kind, w.name, e.Name, ref.ConfigMapKeyRef.Key, ref.ConfigMapKeyRef.Name)
					}
				}
			}
			for _, vm := range c.VolumeMounts {
				if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name }) &&
					!(w.kind == "StatefulSet" && vm.Name == "data") {
					t.Errorf("%s %s: container %s mounts %s, which is no volume", w.kind, w.name, c.Name, vm.Name)
				}
			}
			sc := c.SecurityContext
			if sc != nil && sc.Privileged != nil && *sc.Privileged {
				if w.name != "stickylb-xdp" || c.Name != "mount-bpffs" {
					t.Errorf("%s %s: container %s is privileged", w.kind, w.name, c.Name)
				}
				continue
			}
			if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil ||
				!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("%s %s: container %s: want allowPrivilegeEscalation false, readOnlyRootFilesystem true, capabilities dropped: %+v", w.kind, w.name, c.Name, sc)
			}
		}
	}
	for _, s := range m.services {
		var selected []workload
		for _, w := range m.workloads {
			if matches(s.Spec.Selector, w.pod.Labels) {
				selected = append(selected, w)
			}
		}
		if len(selected) != 1 {
			t.Errorf("Service %s selects %d workloads", s.Name, len(selected))
			continue
		}
		for _, p := range s.Spec.Ports {
			if name := p.TargetPort.StrVal; name != "" && !slices.ContainsFunc(selected[0].pod.Spec.Containers, func(c corev1.Container) bool {
				return slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == name })
			}) {
				t.Errorf("Service %s: target port %s is no container port of %s", s.Name, name, selected[0].name)
			}
		}
	}
	for _, p := range m.pdbs {
		if !slices.ContainsFunc(m.workloads, func(w workload) bool { return matches(p.Spec.Selector.MatchLabels, w.pod.Labels) }) {
			t.Errorf("PodDisruptionBudget %s selects nothing", p.Name)
		}
	}
}

func find(t *testing.T, m manifests, kind, name string) workload {
	t.Helper()
	for _, w := range m.workloads {
		if w.kind == kind && w.name == name {
			return w
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return workload{}
}

// The shape each tier needs: three control-plane replicas spread over nodes; XDP nodes on the
// host's network with the capabilities XDP needs and nothing more, the host's bpffs, and a
// drain before they stop; secret files readable by the non-root user that reads them.
func TestManifestsShape(t *testing.T) {
	m := load(t)
	for _, o := range decodeAll(t) {
		if d, ok := o.obj.(*appsv1.Deployment); ok && d.Name == "stickylb-xds" {
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
				t.Errorf("stickylb-xds: %v replicas, want 3", d.Spec.Replicas)
			}
		}
	}
	// A replica that lost etcd leaves the Service (readiness: /healthz answers 503), and is
	// not restarted for it (liveness: /livez; on /healthz an etcd outage would restart
	// every replica).
	for _, c := range find(t, m, "Deployment", "stickylb-xds").pod.Spec.Containers {
		if r, l := c.ReadinessProbe, c.LivenessProbe; r == nil || r.HTTPGet == nil || r.HTTPGet.Path != "/healthz" ||
			l == nil || l.HTTPGet == nil || l.HTTPGet.Path != "/livez" {
			t.Errorf("stickylb-xds %s: readiness %+v, liveness %+v: want /healthz and /livez", c.Name, r, l)
		}
	}
	xdp := find(t, m, "DaemonSet", "stickylb-xdp").pod.Spec
	if !xdp.HostNetwork || xdp.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("stickylb-xdp: hostNetwork %v, dnsPolicy %s", xdp.HostNetwork, xdp.DNSPolicy)
	}
	c := xdp.Containers[0]
	if got := c.SecurityContext.Capabilities.Add; !slices.Equal(got, []corev1.Capability{"BPF", "NET_ADMIN", "PERFMON"}) {
		t.Errorf("stickylb-xdp: capabilities %v, want BPF NET_ADMIN PERFMON", got)
	}
	if u := c.SecurityContext.RunAsUser; u == nil || *u != 0 {
		t.Errorf("stickylb-xdp: runAsUser %v, want 0 (added capabilities reach root processes only)", u)
	}
	bpffs := slices.IndexFunc(xdp.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil && v.HostPath.Path == "/sys/fs/bpf" })
	if bpffs < 0 || !slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool {
		return vm.Name == xdp.Volumes[bpffs].Name && vm.MountPath == "/sys/fs/bpf"
	}) || !slices.Contains(c.Args, "--pin-root=/sys/fs/bpf/stickylb") {
		t.Errorf("stickylb-xdp: the host's /sys/fs/bpf is not mounted at the pin root's bpffs")
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Exec == nil ||
		!slices.Equal(c.Lifecycle.PreStop.Exec.Command[:3], []string{"/usr/bin/stickylb", "xdp", "drain"}) {
		t.Errorf("stickylb-xdp: no preStop that drains: %+v", c.Lifecycle)
	} else {
		// The drain finds the node by its interface and pin root: the container's own.
		for _, f := range []string{"--iface=", "--pin-root="} {
			i := slices.IndexFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, f) })
			if i < 0 || !slices.Contains(c.Lifecycle.PreStop.Exec.Command, c.Args[i]) {
				t.Errorf("stickylb-xdp: the preStop drain does not pass the container's %s: %v", f, c.Lifecycle.PreStop.Exec.Command)
			}
		}
	}
	// The grace period covers the drain (routers move flows) and --drain-time after SIGTERM.
	if g := xdp.TerminationGracePeriodSeconds; g == nil || *g < 30 || !slices.Contains(c.Args, "--drain-time=10s") {
		t.Errorf("stickylb-xdp: terminationGracePeriodSeconds %v for a 10 s drain time", g)
	}
	for _, w := range m.workloads {
		for _, v := range w.pod.Spec.Volumes {
			if v.Secret != nil && v.Secret.DefaultMode != nil && *v.Secret.DefaultMode&0o040 == 0 {
				t.Errorf("%s %s: Secret %s mode %o: the pod's group (fsGroup) cannot read it", w.kind, w.name, v.Secret.SecretName, *v.Secret.DefaultMode)
			}
			// stickylb refuses a tokens file others may read (internal/secretfile); Kubernetes
			// mounts a Secret 0644 unless told.
			if v.Secret != nil && v.Secret.SecretName == "stickylb-api-tokens" && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o027 != 0) {
				t.Errorf("%s %s: Secret %s mode %v: others may read it, or the group write it", w.kind, w.name, v.Secret.SecretName, v.Secret.DefaultMode)
			}
		}
	}
}

// The files the pods read, checked by what reads them: the pools file by stickylb's parser,
// the Caddyfile by Caddy's adapter with stickylb's modules.
func TestManifestsFiles(t *testing.T) {
	m := load(t)
	cm := m.configMaps["stickylb-pools"]
	if cm == nil {
		t.Fatal("no ConfigMap stickylb-pools")
	}
	f, err := pools.Parse("stickylb-pools/pools.yaml", []byte(cm.Data["pools.yaml"]))
	if err != nil {
		t.Errorf("the pools file: %v", err)
	} else if len(f.Services) == 0 || len(f.Warnings) != 0 {
		t.Errorf("the pools file: %d services, warnings %v", len(f.Services), f.Warnings)
	}
	caddy := m.configMaps["stickylb-caddy"]
	if caddy == nil {
		t.Fatal("no ConfigMap stickylb-caddy")
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	cfg, warnings, err := adapter.Adapt([]byte(caddy.Data["Caddyfile"]), map[string]any{"filename": "Caddyfile"})
	if err != nil || len(warnings) != 0 {
		t.Fatalf("the Caddyfile: %v %v", err, warnings)
	}
	for _, want := range []string{`"source":"stickylb_xds"`, `"policy":"sticky_cookie"`, `"secret_file":"/etc/caddy/secrets/stickylb.secrets"`} {
		if !bytes.Contains(cfg, []byte(want)) {
			t.Errorf("the adapted Caddyfile lacks %s:\n%s", want, cfg)
		}
	}
}
