package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v2"
)

// k8sDir holds the Kubernetes manifests.
const k8sDir = "kubernetes"

// The names the manifests agree on with the image (Containerfile).
const (
	imageName    = "localhost/pgcluster-coredns" // make image's IMAGE, without the tag
	imageUID     = 65532                         // the image's USER
	corefileDir  = "/etc/coredns"                // where the image reads its Corefile
	corefilePath = corefileDir + "/Corefile"
)

// manifest is the part of a Kubernetes object every kind shares, plus the
// fields of the kinds deploy/kubernetes holds that the tests read.
type manifest struct {
	file       string
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string            `yaml:"name"`
		Namespace string            `yaml:"namespace"`
		Labels    map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`       // ConfigMap
	StringData map[string]string `yaml:"stringData"` // Secret
	Resources  []string          `yaml:"resources"`  // Kustomization
	Images     []struct {
		Name string `yaml:"name"`
	} `yaml:"images"` // Kustomization
	Spec struct {
		Replicas int      `yaml:"replicas"` // Deployment
		Selector selector `yaml:"selector"` // Deployment, PodDisruptionBudget: matchLabels; Service: see ServiceSelector
		Template struct {
			Metadata struct {
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"metadata"`
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
		Ports []servicePort `yaml:"ports"` // Service
	} `yaml:"spec"`
}

// selector is a Deployment's or PodDisruptionBudget's selector, or a
// Service's (a plain label map).
type selector struct {
	MatchLabels map[string]string
	Plain       map[string]string
}

func (s *selector) UnmarshalYAML(unmarshal func(any) error) error {
	var m struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	}
	if err := unmarshal(&m); err == nil && m.MatchLabels != nil {
		s.MatchLabels = m.MatchLabels
		return nil
	}
	return unmarshal(&s.Plain)
}

type podSpec struct {
	SecurityContext struct {
		RunAsNonRoot *bool `yaml:"runAsNonRoot"`
		RunAsUser    int   `yaml:"runAsUser"`
	} `yaml:"securityContext"`
	Containers []container `yaml:"containers"`
	Volumes    []struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name  string `yaml:"name"`
			Items []struct {
				Key  string `yaml:"key"`
				Path string `yaml:"path"`
			} `yaml:"items"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
		Protocol      string `yaml:"protocol"`
	} `yaml:"ports"`
	LivenessProbe   *probe `yaml:"livenessProbe"`
	ReadinessProbe  *probe `yaml:"readinessProbe"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Add  []string `yaml:"add"`
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // a number or a port name
	} `yaml:"httpGet"`
}

type servicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort any    `yaml:"targetPort"`
	Protocol   string `yaml:"protocol"`
}

// loadManifests reads every document of every .yaml file of deploy/kubernetes.
func loadManifests(t testing.TB) []*manifest {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(k8sDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no manifests in %s", k8sDir)
	}
	var all []*manifest
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.SetStrict(true)
		for {
			m := &manifest{file: f}
			// Strictly into a map (a key given twice is an error), then
			// into the struct, which keeps only the fields it names.
			var raw map[string]any
			if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: not valid YAML: %v", f, err)
			}
			out, _ := yaml.Marshal(raw)
			if err := yaml.Unmarshal(out, m); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if m.APIVersion == "" || m.Kind == "" || (m.Kind != "Kustomization" && m.Metadata.Name == "") {
				t.Errorf("%s: a document without apiVersion, kind or metadata.name", f)
			}
			all = append(all, m)
		}
	}
	return all
}

// one returns the single manifest of kind, failing the test unless there is
// exactly one.
func one(t testing.TB, ms []*manifest, kind string) *manifest {
	t.Helper()
	var found []*manifest
	for _, m := range ms {
		if m.Kind == kind {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s in %s, found %d", kind, k8sDir, len(found))
	}
	return found[0]
}

// k8sEnv returns the environment the Deployment gives its container, with
// the values of secret.example.yaml for those read from the Secret.
func k8sEnv(t testing.TB, ms []*manifest) map[string]string {
	t.Helper()
	c := one(t, ms, "Deployment").Spec.Template.Spec.Containers[0]
	secret := one(t, ms, "Secret")
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef == nil:
			t.Errorf("deployment.yaml: env %s: only values and secretKeyRef are expected", e.Name)
		case e.ValueFrom.SecretKeyRef.Name != secret.Metadata.Name:
			t.Errorf("deployment.yaml: env %s reads Secret %q, the Secret is %q", e.Name, e.ValueFrom.SecretKeyRef.Name, secret.Metadata.Name)
		default:
			v, ok := secret.StringData[e.ValueFrom.SecretKeyRef.Key]
			if !ok {
				t.Errorf("deployment.yaml: env %s reads key %q, which %s lacks", e.Name, e.ValueFrom.SecretKeyRef.Key, secret.file)
			}
			env[e.Name] = v
		}
	}
	return env
}

// TestKubernetesManifests checks that the manifests agree with each other,
// with their Corefile and with the image: the ConfigMap is mounted where
// the image reads its Corefile, every {$ENV} of the Corefile comes from the
// Secret, the probes and ports are the Corefile's listeners, and the pod
// runs as the image's unprivileged user under the restricted Pod Security
// Standard. The Corefile itself is parsed by TestDeployCorefiles and run
// from the image by TestImage.
func TestKubernetesManifests(t *testing.T) {
	ms := loadManifests(t)
	for _, m := range ms {
		if m.Kind != "Kustomization" && m.Kind != "Namespace" && m.Metadata.Namespace != "pgcluster" {
			t.Errorf("%s: %s %s is not in namespace pgcluster", m.file, m.Kind, m.Metadata.Name)
		}
	}

	kust := one(t, ms, "Kustomization")
	var want []string
	for _, m := range ms {
		if b := filepath.Base(m.file); m.Kind != "Kustomization" && m.Kind != "Secret" && !slices.Contains(want, b) {
			want = append(want, b)
		}
	}
	got := slices.Sorted(slices.Values(kust.Resources))
	if slices.Sort(want); !slices.Equal(got, want) {
		t.Errorf("kustomization.yaml resources %v, want every manifest but the example Secret: %v", got, want)
	}

	dep := one(t, ms, "Deployment")
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("deployment.yaml: %d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if name, _, _ := strings.Cut(c.Image, ":"); name != imageName || len(kust.Images) != 1 || kust.Images[0].Name != imageName {
		t.Errorf("deployment.yaml image %q, kustomization.yaml images %v: want %s, make image's, renamed by kustomize", c.Image, kust.Images, imageName)
	}
	if dep.Spec.Replicas < 2 {
		t.Errorf("deployment.yaml: %d replicas: a fleet needs at least 2", dep.Spec.Replicas)
	}
	if !sameLabels(dep.Spec.Selector.MatchLabels, dep.Spec.Template.Metadata.Labels) {
		t.Errorf("deployment.yaml: selector %v does not select the pods' labels %v", dep.Spec.Selector.MatchLabels, dep.Spec.Template.Metadata.Labels)
	}

	// The Corefile: mounted where the image reads it, passed as the image does.
	cm := one(t, ms, "ConfigMap")
	corefile, ok := cm.Data["Corefile"]
	if !ok {
		t.Fatalf("configmap.yaml: no Corefile key")
	}
	if !slices.Equal(c.Args, []string{"-conf", corefilePath}) {
		t.Errorf("deployment.yaml args %v, want [-conf %s]", c.Args, corefilePath)
	}
	mounted := false
	for _, v := range pod.Volumes {
		if v.ConfigMap == nil || v.ConfigMap.Name != cm.Metadata.Name {
			continue
		}
		for _, vm := range c.VolumeMounts {
			if vm.Name == v.Name && vm.MountPath == corefileDir {
				for _, it := range v.ConfigMap.Items {
					mounted = mounted || (it.Key == "Corefile" && it.Path == "Corefile")
				}
			}
		}
	}
	if !mounted {
		t.Errorf("deployment.yaml does not mount ConfigMap %s's Corefile at %s", cm.Metadata.Name, corefilePath)
	}

	// Every {$ENV} of the Corefile is set, from the Secret, and nothing else.
	env := k8sEnv(t, ms)
	refs := envRefs(corefile)
	for _, name := range refs {
		if _, ok := env[name]; !ok {
			t.Errorf("configmap.yaml's Corefile reads {$%s}, which deployment.yaml does not set", name)
		}
	}
	for name := range env {
		if !slices.Contains(refs, name) {
			t.Errorf("deployment.yaml sets %s, which the Corefile does not read", name)
		}
	}

	// Ports and probes are the Corefile's listeners.
	l := listenersOf(t, corefile)
	port := map[string]int{}
	byNumber := map[string]bool{}
	for _, p := range c.Ports {
		port[p.Name] = p.ContainerPort
		byNumber[p.Protocol+"/"+strconv.Itoa(p.ContainerPort)] = true
	}
	for _, want := range []string{"UDP/" + l.dns, "TCP/" + l.dns, "TCP/" + l.metrics, "TCP/" + l.health, "TCP/" + l.ready} {
		if !byNumber[want] {
			t.Errorf("deployment.yaml: no container port %s, which the Corefile listens on", want)
		}
	}
	checkProbe := func(what string, p *probe, path, want string) {
		switch {
		case p == nil || p.HTTPGet == nil:
			t.Errorf("deployment.yaml: no HTTP %s probe", what)
		case p.HTTPGet.Path != path:
			t.Errorf("deployment.yaml: %s probe on %s, want %s", what, p.HTTPGet.Path, path)
		case probePort(p.HTTPGet.Port, port) != want:
			t.Errorf("deployment.yaml: %s probe on port %v, the Corefile's is %s", what, p.HTTPGet.Port, want)
		}
	}
	checkProbe("liveness", c.LivenessProbe, "/health", l.health)
	checkProbe("readiness", c.ReadinessProbe, "/ready", l.ready)
	if a := dep.Spec.Template.Metadata.Annotations["prometheus.io/port"]; a != l.metrics {
		t.Errorf("deployment.yaml: prometheus.io/port %q, the Corefile's prometheus is on %s", a, l.metrics)
	}

	// Unprivileged, as the restricted Pod Security Standard requires.
	sc := c.SecurityContext
	if pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot || pod.SecurityContext.RunAsUser != imageUID {
		t.Errorf("deployment.yaml: want runAsNonRoot and runAsUser %d (the image's user)", imageUID)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("deployment.yaml: want allowPrivilegeEscalation false and readOnlyRootFilesystem true")
	}
	if !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("deployment.yaml: capabilities drop %v add %v, want drop [ALL] and none added", sc.Capabilities.Drop, sc.Capabilities.Add)
	}

	// The Service sends port 53 to the pods' DNS port, UDP and TCP.
	svc := one(t, ms, "Service")
	if !sameLabels(svc.Spec.Selector.Plain, dep.Spec.Template.Metadata.Labels) {
		t.Errorf("service.yaml: selector %v does not select the pods' labels %v", svc.Spec.Selector.Plain, dep.Spec.Template.Metadata.Labels)
	}
	dns53 := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		target := probePort(p.TargetPort, port)
		if target == "" {
			t.Errorf("service.yaml: port %s targets %v, not a container port", p.Name, p.TargetPort)
		}
		if p.Port == 53 && target == l.dns {
			dns53[p.Protocol] = true
		}
	}
	if !dns53["UDP"] || !dns53["TCP"] {
		t.Errorf("service.yaml: want port 53 to the Corefile's DNS port %s over UDP and TCP", l.dns)
	}
	pdb := one(t, ms, "PodDisruptionBudget")
	if !sameLabels(pdb.Spec.Selector.MatchLabels, dep.Spec.Template.Metadata.Labels) {
		t.Errorf("poddisruptionbudget.yaml: selector %v does not select the pods", pdb.Spec.Selector.MatchLabels)
	}
}

// sameLabels reports whether selector is non-empty and selects labels.
func sameLabels(selector, labels map[string]string) bool {
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

// probePort returns the container port number a probe or Service names (a
// number, or a port name from named), "" when it names none.
func probePort(p any, named map[string]int) string {
	switch v := p.(type) {
	case int:
		for _, n := range named {
			if n == v {
				return strconv.Itoa(v)
			}
		}
	case string:
		if n, ok := named[v]; ok {
			return strconv.Itoa(n)
		}
	}
	return ""
}
