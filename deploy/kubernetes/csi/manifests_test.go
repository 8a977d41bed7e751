package csi

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/nvmegate/nvmegate/csidriver"
)

// driverName is the driver's own name: the manifests must use it.
const driverName = csidriver.DriverName

const (
	systemNamespace = "nvmegate-system" // the driver's own objects
	tenantNamespace = "acme"            // the namespaced objects under example/
	kubeletDir      = "/var/lib/kubelet"
	registrationDir = "/var/lib/kubelet/plugins_registry"

	// gatewayManifest holds the gateway's Service, which --addr names.
	gatewayManifest = "../nvmegate.yaml"
)

// clusterScoped are the kinds in these manifests that have no namespace.
var clusterScoped = map[string]bool{
	"Namespace": true, "CSIDriver": true, "StorageClass": true, "PersistentVolume": true,
	"ClusterRole": true, "ClusterRoleBinding": true,
}

// volumeHandle is the driver's volume ID: <subsystem NQN>/<nsid>@<job id>,
// the job as nvmegate.ValidateJobID spells it.
var volumeHandle = regexp.MustCompile(`^(nqn\.[0-9]{4}-[0-9]{2}\.[^/@\s]+)/([1-9][0-9]*)@([A-Za-z0-9][A-Za-z0-9._:-]{0,127})$`)

// csiStringLimit is the CSI spec's general size limit of a string field,
// which a volume ID is.
const csiStringLimit = 128

// decoder decodes one YAML document into its typed API object, failing on
// unknown and duplicate fields.
func decoder() *json.Serializer {
	return json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		json.SerializerOptions{Yaml: true, Strict: true})
}

// docSeparator is a line of "---" that separates YAML documents.
var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// splitDocuments splits a multi-document YAML file on its "---" lines and
// drops documents that hold nothing but blank lines and comments.
func splitDocuments(data string) []string {
	var docs []string
	for _, d := range docSeparator.Split(data, -1) {
		for _, line := range strings.Split(d, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				docs = append(docs, d)
				break
			}
		}
	}
	return docs
}

type manifest struct {
	file string // slash-separated, relative to this directory
	doc  int    // 1-based, among the file's non-empty documents
	obj  runtime.Object
}

func (m manifest) kind() string { return m.obj.GetObjectKind().GroupVersionKind().Kind }

func (m manifest) meta() interface {
	GetName() string
	GetNamespace() string
} {
	a, err := meta.Accessor(m.obj)
	if err != nil {
		panic(err)
	}
	return a
}

func (m manifest) String() string {
	return fmt.Sprintf("%s#%d (%s %s)", m.file, m.doc, m.kind(), m.meta().GetName())
}

// decodeFile decodes every document of a YAML file strictly.
func decodeFile(t *testing.T, file, data string) []manifest {
	t.Helper()
	var out []manifest
	for i, doc := range splitDocuments(data) {
		obj, gvk, err := decoder().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Errorf("%s, document %d: %v", file, i+1, err)
			continue
		}
		if gvk.Kind == "" || gvk.Version == "" {
			t.Errorf("%s, document %d: no apiVersion or kind", file, i+1)
			continue
		}
		out = append(out, manifest{file: file, doc: i + 1, obj: obj})
	}
	return out
}

// loadManifests decodes every *.yaml file under this directory.
func loadManifests(t *testing.T) []manifest {
	t.Helper()
	var out []manifest
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch filepath.Ext(p) {
		case ".yml", ".json":
			t.Errorf("%s: manifests are *.yaml (the test reads only those)", p)
		case ".yaml":
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out = append(out, decodeFile(t, filepath.ToSlash(p), string(data))...)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no manifests found")
	}
	return out
}

func TestStrictDecoding(t *testing.T) {
	const deployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: x
  namespace: nvmegate-system
spec:
  %s: 1
  selector:
    matchLabels: {app: x}
  template:
    metadata:
      labels: {app: x}
    spec:
      containers:
        - {name: x, image: x}
`
	t.Run("a well-formed document decodes", func(t *testing.T) {
		obj, _, err := decoder().Decode([]byte(fmt.Sprintf(deployment, "replicas")), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		d, ok := obj.(*appsv1.Deployment)
		if !ok || d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
			t.Fatalf("decoded %T %+v", obj, obj)
		}
	})
	t.Run("a misspelled field fails", func(t *testing.T) {
		_, _, err := decoder().Decode([]byte(fmt.Sprintf(deployment, "replica")), nil, nil)
		if err == nil || !runtime.IsStrictDecodingError(err) || !strings.Contains(err.Error(), "replica") {
			t.Fatalf("spec.replica: got %v, want a strict decoding error naming the field", err)
		}
	})
	t.Run("a duplicate field fails", func(t *testing.T) {
		doc := strings.Replace(fmt.Sprintf(deployment, "replicas"), "  name: x\n", "  name: x\n  name: y\n", 1)
		if _, _, err := decoder().Decode([]byte(doc), nil, nil); err == nil {
			t.Fatal("metadata.name twice: decoded")
		}
	})
	t.Run("an unknown kind fails", func(t *testing.T) {
		doc := strings.Replace(fmt.Sprintf(deployment, "replicas"), "kind: Deployment", "kind: Deploymnet", 1)
		if _, _, err := decoder().Decode([]byte(doc), nil, nil); err == nil {
			t.Fatal("kind Deploymnet: decoded")
		}
	})
	t.Run("documents split on --- lines, empty ones skipped", func(t *testing.T) {
		docs := splitDocuments("# a comment\n---\na: 1\n---   \n\n# only a comment\n---\nb: |\n  ---x\n")
		if len(docs) != 2 || !strings.Contains(docs[0], "a: 1") || !strings.Contains(docs[1], "---x") {
			t.Fatalf("got %q", docs)
		}
	})
}

type key struct{ ns, name string }

func (k key) String() string { return k.ns + "/" + k.name }

// objects indexes the decoded manifests by kind.
type objects struct {
	all                 []manifest
	where               map[runtime.Object]manifest
	namespaces          map[string]*corev1.Namespace
	drivers             []*storagev1.CSIDriver
	classes             map[string]*storagev1.StorageClass
	pvs                 map[string]*corev1.PersistentVolume
	pvcs                map[key]*corev1.PersistentVolumeClaim
	serviceAccounts     map[key]*corev1.ServiceAccount
	deployments         []*appsv1.Deployment
	daemonSets          []*appsv1.DaemonSet
	pods                []*corev1.Pod
	roles               map[key]*rbacv1.Role
	clusterRoles        map[string]*rbacv1.ClusterRole
	roleBindings        []*rbacv1.RoleBinding
	clusterRoleBindings []*rbacv1.ClusterRoleBinding
}

func index(t *testing.T, all []manifest) *objects {
	t.Helper()
	o := &objects{
		all: all, where: map[runtime.Object]manifest{},
		namespaces: map[string]*corev1.Namespace{}, classes: map[string]*storagev1.StorageClass{},
		pvs: map[string]*corev1.PersistentVolume{}, pvcs: map[key]*corev1.PersistentVolumeClaim{},
		serviceAccounts: map[key]*corev1.ServiceAccount{}, roles: map[key]*rbacv1.Role{},
		clusterRoles: map[string]*rbacv1.ClusterRole{},
	}
	seen := map[string]manifest{}
	for _, m := range all {
		id := m.obj.GetObjectKind().GroupVersionKind().GroupKind().String() + " " + m.meta().GetNamespace() + "/" + m.meta().GetName()
		if prev, ok := seen[id]; ok {
			t.Errorf("%s: %s is also defined in %s", m, id, prev)
		}
		seen[id] = m
		o.where[m.obj] = m
		switch x := m.obj.(type) {
		case *corev1.Namespace:
			o.namespaces[x.Name] = x
		case *storagev1.CSIDriver:
			o.drivers = append(o.drivers, x)
		case *storagev1.StorageClass:
			o.classes[x.Name] = x
		case *corev1.PersistentVolume:
			o.pvs[x.Name] = x
		case *corev1.PersistentVolumeClaim:
			o.pvcs[key{x.Namespace, x.Name}] = x
		case *corev1.ServiceAccount:
			o.serviceAccounts[key{x.Namespace, x.Name}] = x
		case *appsv1.Deployment:
			o.deployments = append(o.deployments, x)
		case *appsv1.DaemonSet:
			o.daemonSets = append(o.daemonSets, x)
		case *corev1.Pod:
			o.pods = append(o.pods, x)
		case *rbacv1.Role:
			o.roles[key{x.Namespace, x.Name}] = x
		case *rbacv1.ClusterRole:
			o.clusterRoles[x.Name] = x
		case *rbacv1.RoleBinding:
			o.roleBindings = append(o.roleBindings, x)
		case *rbacv1.ClusterRoleBinding:
			o.clusterRoleBindings = append(o.clusterRoleBindings, x)
		default:
			t.Errorf("%s: the test knows no facts about kind %T; teach it some", m, x)
		}
	}
	return o
}

// workload is a pod template and where it came from.
type workload struct {
	name string // "Deployment nvmegate-system/x"
	ns   string
	spec *corev1.PodSpec
}

func (o *objects) workloads() []workload {
	var w []workload
	for _, d := range o.deployments {
		w = append(w, workload{"Deployment " + d.Namespace + "/" + d.Name, d.Namespace, &d.Spec.Template.Spec})
	}
	for _, d := range o.daemonSets {
		w = append(w, workload{"DaemonSet " + d.Namespace + "/" + d.Name, d.Namespace, &d.Spec.Template.Spec})
	}
	for _, p := range o.pods {
		w = append(w, workload{"Pod " + p.Namespace + "/" + p.Name, p.Namespace, &p.Spec})
	}
	return w
}

func allContainers(s *corev1.PodSpec) []corev1.Container {
	c := slices.Concat(s.InitContainers, s.Containers)
	for _, e := range s.EphemeralContainers {
		c = append(c, corev1.Container(e.EphemeralContainerCommon))
	}
	return c
}

func container(s *corev1.PodSpec, name string) *corev1.Container {
	for i := range s.Containers {
		if s.Containers[i].Name == name {
			return &s.Containers[i]
		}
	}
	return nil
}

func volume(s *corev1.PodSpec, name string) *corev1.Volume {
	for i := range s.Volumes {
		if s.Volumes[i].Name == name {
			return &s.Volumes[i]
		}
	}
	return nil
}

// flag returns the value of --name in args, given as "--name=v" or
// "--name v"; a bare boolean flag has the value "true".
func flag(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name {
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				return args[i+1], true
			}
			return "true", true
		}
	}
	return "", false
}

// under reports whether p is dir or lies below it, and p's path relative
// to dir.
func under(p, dir string) (string, bool) {
	p, dir = path.Clean(p), path.Clean(dir)
	if p == dir {
		return ".", true
	}
	if dir == "/" {
		return p[1:], strings.HasPrefix(p, "/")
	}
	rel, ok := strings.CutPrefix(p, dir+"/")
	return rel, ok
}

// mountOf returns the container's mount (the deepest one) holding path p,
// and p's path relative to it.
func mountOf(c *corev1.Container, p string) (*corev1.VolumeMount, string) {
	var best *corev1.VolumeMount
	var rel string
	for i := range c.VolumeMounts {
		vm := &c.VolumeMounts[i]
		if r, ok := under(p, vm.MountPath); ok && (best == nil || len(vm.MountPath) > len(best.MountPath)) {
			best, rel = vm, r
		}
	}
	return best, rel
}

// hostPathOf returns the host path behind the container's path p, if a
// hostPath volume holds it.
func hostPathOf(s *corev1.PodSpec, c *corev1.Container, p string) (string, bool) {
	vm, rel := mountOf(c, p)
	if vm == nil {
		return "", false
	}
	v := volume(s, vm.Name)
	if v == nil || v.HostPath == nil || vm.SubPath != "" || vm.SubPathExpr != "" {
		return "", false
	}
	return path.Join(v.HostPath.Path, rel), true
}

// unixPath is the file of a unix:// endpoint.
func unixPath(t *testing.T, where, endpoint string) string {
	t.Helper()
	p, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok || !path.IsAbs(p) {
		t.Errorf("%s: %q is not unix:///<absolute path>", where, endpoint)
	}
	return p
}

// driverContainer returns the workload's nvmegate-csi container and its
// mode (its first argument).
func driverContainer(w workload) (*corev1.Container, string) {
	c := container(w.spec, "nvmegate-csi")
	if c == nil {
		return nil, ""
	}
	var args []string
	args = append(args, c.Command...)
	args = append(args, c.Args...)
	if len(c.Command) > 0 {
		args = args[1:] // the binary
	}
	if len(args) == 0 {
		return c, ""
	}
	return c, args[0]
}

func (o *objects) byMode(t *testing.T, mode string) workload {
	t.Helper()
	var found []workload
	for _, w := range o.workloads() {
		if _, m := driverContainer(w); m == mode {
			found = append(found, w)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d workloads run nvmegate-csi %s, want 1", len(found), mode)
	}
	return found[0]
}

func boolOf(b *bool) bool { return b != nil && *b }

func TestManifests(t *testing.T) {
	o := index(t, loadManifests(t))

	t.Run("every file opens with a comment", func(t *testing.T) {
		files := map[string]bool{}
		for _, m := range o.all {
			files[m.file] = true
		}
		for f := range files {
			data, err := os.ReadFile(filepath.FromSlash(f))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(data), "#") {
				t.Errorf("%s: no leading comment saying why its settings are what they are", f)
			}
		}
	})

	t.Run("the README names every file", func(t *testing.T) {
		readme, err := os.ReadFile("README.md")
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range o.all {
			if !strings.Contains(string(readme), "`"+m.file+"`") {
				t.Errorf("README.md does not name `%s`", m.file)
			}
		}
	})

	t.Run("the CSIDriver", func(t *testing.T) {
		if len(o.drivers) != 1 {
			t.Fatalf("%d CSIDriver objects, want 1", len(o.drivers))
		}
		d := o.drivers[0]
		if d.Name != driverName {
			t.Errorf("CSIDriver %q, want %q", d.Name, driverName)
		}
		if !boolOf(d.Spec.AttachRequired) {
			t.Error("attachRequired is not true: ControllerPublishVolume, which admits the node into the job, would never be called")
		}
		if d.Spec.PodInfoOnMount == nil || *d.Spec.PodInfoOnMount {
			t.Error("podInfoOnMount is not false")
		}
		if !slices.Equal(d.Spec.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}) {
			t.Errorf("volumeLifecycleModes %v, want [Persistent]", d.Spec.VolumeLifecycleModes)
		}
		if d.Spec.FSGroupPolicy == nil || *d.Spec.FSGroupPolicy != storagev1.NoneFSGroupPolicy {
			t.Error("fsGroupPolicy is not None (the volumes are raw block)")
		}
	})

	t.Run("StorageClasses and PVs name the driver", func(t *testing.T) {
		if len(o.classes) == 0 || len(o.pvs) == 0 {
			t.Errorf("%d StorageClasses and %d PVs; the example has both", len(o.classes), len(o.pvs))
		}
		for _, sc := range o.classes {
			if sc.Provisioner != driverName {
				t.Errorf("StorageClass %s: provisioner %q, want %q", sc.Name, sc.Provisioner, driverName)
			}
		}
		for _, pv := range o.pvs {
			if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driverName {
				t.Errorf("PV %s: not a CSI volume of %s", pv.Name, driverName)
			}
		}
	})

	t.Run("StorageClass parameters", func(t *testing.T) {
		provisioner := container(o.byMode(t, "controller").spec, "csi-provisioner")
		for _, sc := range o.classes {
			for k := range sc.Parameters {
				if k != "dataset" && k != "job" && !strings.HasPrefix(k, "csi.storage.k8s.io/") {
					t.Errorf("StorageClass %s: parameter %q; the driver knows dataset and job", sc.Name, k)
				}
			}
			if sc.Parameters["dataset"] == "" {
				t.Errorf("StorageClass %s: no dataset parameter", sc.Name)
			}
			if job, ok := sc.Parameters["job"]; ok {
				if !regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`).MatchString(job) {
					t.Errorf("StorageClass %s: job %q is not a job ID", sc.Name, job)
				}
			} else if provisioner == nil {
				t.Errorf("StorageClass %s: no job parameter and no csi-provisioner", sc.Name)
			} else if v, _ := flag(provisioner.Args, "extra-create-metadata"); v != "true" {
				t.Errorf("StorageClass %s names no job, so the driver derives it from the PVC, but csi-provisioner lacks --extra-create-metadata", sc.Name)
			}
			if sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingImmediate {
				t.Errorf("StorageClass %s: volumeBindingMode is not Immediate", sc.Name)
			}
		}
	})

	t.Run("volumes are raw block", func(t *testing.T) {
		block := func(m *corev1.PersistentVolumeMode) bool { return m != nil && *m == corev1.PersistentVolumeBlock }
		for _, pv := range o.pvs {
			if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == driverName && !block(pv.Spec.VolumeMode) {
				t.Errorf("PV %s: volumeMode is not Block", pv.Name)
			}
		}
		for k, pvc := range o.pvcs {
			ours := false
			if sc := pvc.Spec.StorageClassName; sc != nil && o.classes[*sc] != nil {
				ours = true
			}
			if pv := o.pvs[pvc.Spec.VolumeName]; pvc.Spec.VolumeName != "" && pv != nil && pv.Spec.CSI != nil && pv.Spec.CSI.Driver == driverName {
				ours = true
			}
			if !ours {
				t.Errorf("PVC %s: neither of a StorageClass nor bound to a PV of %s", k, driverName)
			} else if !block(pvc.Spec.VolumeMode) {
				t.Errorf("PVC %s: volumeMode is not Block", k)
			}
		}
	})

	t.Run("static PVs and their claims bind to each other only", func(t *testing.T) {
		str := func(p *string) string {
			if p == nil {
				return "<unset>"
			}
			return *p
		}
		for k, pvc := range o.pvcs {
			if pvc.Spec.VolumeName == "" {
				continue
			}
			pv := o.pvs[pvc.Spec.VolumeName]
			if pv == nil {
				t.Errorf("PVC %s: volumeName %s is no PV here", k, pvc.Spec.VolumeName)
				continue
			}
			if r := pv.Spec.ClaimRef; r == nil || r.Namespace != pvc.Namespace || r.Name != pvc.Name {
				t.Errorf("PV %s: claimRef does not name PVC %s (any claim could bind it)", pv.Name, k)
			}
			if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != pv.Spec.StorageClassName {
				t.Errorf("PVC %s: storageClassName %s, PV %s has %q; unset, the default class is filled in and they never bind",
					k, str(pvc.Spec.StorageClassName), pv.Name, pv.Spec.StorageClassName)
			}
			for _, a := range pvc.Spec.AccessModes {
				if !slices.Contains(pv.Spec.AccessModes, a) {
					t.Errorf("PVC %s: access mode %s, which PV %s lacks", k, a, pv.Name)
				}
			}
			want, have := pvc.Spec.Resources.Requests[corev1.ResourceStorage], pv.Spec.Capacity[corev1.ResourceStorage]
			if want.Cmp(have) > 0 {
				t.Errorf("PVC %s: requests %s, PV %s has %s", k, want.String(), pv.Name, have.String())
			}
		}
	})

	t.Run("volume handles", func(t *testing.T) {
		for _, pv := range o.pvs {
			if pv.Spec.CSI == nil {
				continue
			}
			h := pv.Spec.CSI.VolumeHandle
			m := volumeHandle.FindStringSubmatch(h)
			if m == nil {
				t.Errorf("PV %s: volume handle %q is not <subsystem NQN>/<nsid>@<job id>", pv.Name, h)
				continue
			}
			if nsid, err := strconv.ParseUint(m[2], 10, 32); err != nil || nsid == 0 || nsid == 0xffffffff {
				t.Errorf("PV %s: namespace ID %s", pv.Name, m[2])
			}
			if len(h) > csiStringLimit {
				t.Errorf("PV %s: volume handle is %d bytes; CSI allows %d", pv.Name, len(h), csiStringLimit)
			}
		}
		if h := "nqn.2026-01.io.example:acme-ckpt/1@train-42"; o.pvs["train-42-checkpoints"] == nil ||
			o.pvs["train-42-checkpoints"].Spec.CSI == nil || o.pvs["train-42-checkpoints"].Spec.CSI.VolumeHandle != h {
			t.Errorf("the example PV train-42-checkpoints has not the handle %s", h)
		}
		for _, bad := range []string{"nqn.2026-01.io.example:x/1", "nqn.2026-01.io.example:x@j", "nqn.2026-01.io.example:x/0@j", "x/1@j", "nqn.2026-01.io.example:x/1@-j"} {
			if volumeHandle.MatchString(bad) {
				t.Errorf("the handle pattern accepts %q", bad)
			}
		}
	})

	t.Run("node plugin", func(t *testing.T) {
		w := o.byMode(t, "node")
		s := w.spec
		if !strings.HasPrefix(w.name, "DaemonSet ") {
			t.Errorf("%s runs the node plugin; a DaemonSet must", w.name)
		}
		node, _ := driverContainer(w)
		reg := container(s, "node-driver-registrar")
		if reg == nil {
			t.Fatalf("%s: no node-driver-registrar container", w.name)
		}
		if !s.HostNetwork {
			t.Errorf("%s: not hostNetwork (NVMe/TCP must leave from the node's addresses)", w.name)
		} else if s.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
			t.Errorf("%s: hostNetwork with dnsPolicy %q; only ClusterFirstWithHostNet resolves the gateway's Service name", w.name, s.DNSPolicy)
		}
		if node.SecurityContext == nil || !boolOf(node.SecurityContext.Privileged) {
			t.Errorf("%s: nvmegate-csi is not privileged", w.name)
		}
		if reg.SecurityContext != nil && boolOf(reg.SecurityContext.Privileged) {
			t.Errorf("%s: the registrar is privileged", w.name)
		}

		// The socket: the registrar's and the plugin's are one file, and
		// the kubelet's path to it is the host path of that file, in the
		// driver's own plugin directory.
		csiAddr, ok := flag(reg.Args, "csi-address")
		if !ok {
			t.Fatalf("%s: the registrar has no --csi-address", w.name)
		}
		regPath, ok := flag(reg.Args, "kubelet-registration-path")
		if !ok {
			t.Fatalf("%s: the registrar has no --kubelet-registration-path", w.name)
		}
		endpoint, _ := flag(node.Args, "endpoint")
		plugSock, ok1 := hostPathOf(s, node, unixPath(t, w.name, endpoint))
		regSock, ok2 := hostPathOf(s, reg, csiAddr)
		if !ok1 || !ok2 || plugSock != regSock {
			t.Errorf("%s: the plugin's socket (host %q) and the registrar's --csi-address (host %q) are not one hostPath file", w.name, plugSock, regSock)
		}
		pluginDir := path.Join(kubeletDir, "plugins", driverName)
		if path.Dir(regSock) != pluginDir {
			t.Errorf("%s: the socket's host directory is %s, want %s", w.name, path.Dir(regSock), pluginDir)
		}
		if regPath != regSock {
			t.Errorf("%s: --kubelet-registration-path=%s, but the socket is at %s on the host", w.name, regPath, regSock)
		}
		if _, ok := under(regPath, pluginDir); !ok || !strings.Contains(regPath, "/"+driverName+"/") {
			t.Errorf("%s: --kubelet-registration-path=%s is not in the driver's plugin directory %s", w.name, regPath, pluginDir)
		}
		regDir, _ := flag(reg.Args, "plugin-registration-path")
		if regDir == "" {
			regDir = "/registration" // the registrar's default
		}
		if h, ok := hostPathOf(s, reg, regDir); !ok || h != registrationDir {
			t.Errorf("%s: the registrar's %s is not the host's %s", w.name, regDir, registrationDir)
		}

		// The kubelet directory, at its own path, with Bidirectional
		// propagation.
		found := false
		for _, vm := range node.VolumeMounts {
			v := volume(s, vm.Name)
			if v == nil || v.HostPath == nil || path.Clean(v.HostPath.Path) != kubeletDir {
				continue
			}
			found = true
			if vm.MountPath != kubeletDir {
				t.Errorf("%s: the kubelet directory is mounted at %s; the kubelet passes host paths", w.name, vm.MountPath)
			}
			if vm.MountPropagation == nil || *vm.MountPropagation != corev1.MountPropagationBidirectional {
				t.Errorf("%s: the kubelet directory's mount propagation is not Bidirectional; pods would not see the plugin's mounts", w.name)
			}
		}
		if !found {
			t.Errorf("%s: nvmegate-csi does not mount the kubelet directory %s", w.name, kubeletDir)
		}
		for _, dir := range []string{"/dev", "/sys"} {
			if h, ok := hostPathOf(s, node, dir); !ok || h != dir {
				t.Errorf("%s: nvmegate-csi's %s is not the host's", w.name, dir)
			}
		}
		state, _ := flag(node.Args, "state-dir")
		if h, ok := hostPathOf(s, node, state); state == "" || !ok {
			t.Errorf("%s: --state-dir %q is not on a hostPath volume", w.name, state)
		} else if vm, _ := mountOf(node, state); volume(s, vm.Name).HostPath.Type == nil ||
			*volume(s, vm.Name).HostPath.Type != corev1.HostPathDirectoryOrCreate {
			t.Errorf("%s: the state directory %s is not DirectoryOrCreate", w.name, h)
		}
	})

	t.Run("controller", func(t *testing.T) {
		w := o.byMode(t, "controller")
		s := w.spec
		var replicas *int32
		for _, d := range o.deployments {
			if &d.Spec.Template.Spec == s {
				replicas = d.Spec.Replicas
			}
		}
		if replicas == nil || *replicas != 1 {
			t.Errorf("%s: not a Deployment of 1 replica", w.name)
		}
		if s.HostNetwork || s.HostPID || s.HostIPC {
			t.Errorf("%s: shares a host namespace; the controller needs no host access", w.name)
		}
		for _, v := range s.Volumes {
			if v.HostPath != nil {
				t.Errorf("%s: hostPath volume %s; the controller needs no host access", w.name, v.Name)
			}
		}
		ctl, _ := driverContainer(w)
		endpoint, _ := flag(ctl.Args, "endpoint")
		sock := unixPath(t, w.name, endpoint)
		sockMount, _ := mountOf(ctl, sock)
		if sockMount == nil || volume(s, sockMount.Name) == nil || volume(s, sockMount.Name).EmptyDir == nil {
			t.Fatalf("%s: the endpoint %s is not on an emptyDir", w.name, sock)
		}
		for name, want := range map[string][]string{
			"csi-attacher":    {"leader-election"},
			"csi-provisioner": {"leader-election", "extra-create-metadata"},
		} {
			c := container(s, name)
			if c == nil {
				t.Errorf("%s: no %s", w.name, name)
				continue
			}
			for _, f := range want {
				if v, _ := flag(c.Args, f); v != "true" {
					t.Errorf("%s: %s lacks --%s", w.name, name, f)
				}
			}
			addr, _ := flag(c.Args, "csi-address")
			vm, rel := mountOf(c, addr)
			if addr != sock || vm == nil || vm.Name != sockMount.Name || rel != path.Base(sock) {
				t.Errorf("%s: %s --csi-address=%s is not the driver's socket %s on volume %s", w.name, name, addr, sock, sockMount.Name)
			}
		}
		for _, c := range allContainers(s) {
			sc, psc := c.SecurityContext, s.SecurityContext
			if sc == nil {
				sc = &corev1.SecurityContext{}
			}
			if psc == nil {
				psc = &corev1.PodSecurityContext{}
			}
			nonRoot, seccomp := sc.RunAsNonRoot, sc.SeccompProfile
			if nonRoot == nil {
				nonRoot = psc.RunAsNonRoot
			}
			if seccomp == nil {
				seccomp = psc.SeccompProfile
			}
			if !boolOf(nonRoot) {
				t.Errorf("%s: %s may run as root", w.name, c.Name)
			}
			if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("%s: %s has not the RuntimeDefault seccomp profile", w.name, c.Name)
			}
			if !boolOf(sc.ReadOnlyRootFilesystem) {
				t.Errorf("%s: %s's root file system is writable", w.name, c.Name)
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s: %s allows privilege escalation", w.name, c.Name)
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
				t.Errorf("%s: %s does not drop all capabilities", w.name, c.Name)
			}
			if boolOf(sc.Privileged) {
				t.Errorf("%s: %s is privileged", w.name, c.Name)
			}
		}
	})

	t.Run("nvmegate-csi reaches SPIRE and the gateway", func(t *testing.T) {
		svcs := gatewayServices(t)
		for _, mode := range []string{"controller", "node"} {
			w := o.byMode(t, mode)
			c, _ := driverContainer(w)
			sock, _ := flag(c.Args, "spiffe-socket")
			if vm, _ := mountOf(c, unixPath(t, w.name, sock)); vm == nil || !vm.ReadOnly {
				t.Errorf("%s: --spiffe-socket %s is not on a read-only volume mount", w.name, sock)
			}
			addr, _ := flag(c.Args, "addr")
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				t.Errorf("%s: --addr %q: %v", w.name, addr, err)
				continue
			}
			svc, ns, ok := strings.Cut(strings.TrimSuffix(strings.TrimSuffix(host, ".cluster.local"), ".svc"), ".")
			if !ok || strings.Contains(ns, ".") {
				t.Errorf("%s: --addr host %s is not <service>.<namespace>.svc", w.name, host)
				continue
			}
			if ports, ok := svcs[key{ns, svc}]; !ok || !slices.Contains(ports, port) {
				t.Errorf("%s: --addr %s: %s has no Service %s/%s with port %s", w.name, addr, gatewayManifest, ns, svc, port)
			}
		}
	})

	t.Run("selectors select their pod templates", func(t *testing.T) {
		check := func(name string, sel *metav1.LabelSelector, labels map[string]string) {
			if sel == nil || len(sel.MatchLabels) == 0 {
				t.Errorf("%s: no selector matchLabels", name)
			}
			s, err := metav1.LabelSelectorAsSelector(sel)
			if err != nil || !s.Matches(k8slabels.Set(labels)) {
				t.Errorf("%s: selector %v does not select its template's labels %v (%v)", name, sel, labels, err)
			}
		}
		for _, d := range o.deployments {
			check("Deployment "+d.Name, d.Spec.Selector, d.Spec.Template.Labels)
		}
		for _, d := range o.daemonSets {
			check("DaemonSet "+d.Name, d.Spec.Selector, d.Spec.Template.Labels)
		}
	})

	t.Run("service accounts and bindings", func(t *testing.T) {
		for _, w := range o.workloads() {
			if strings.HasPrefix(w.name, "Pod ") {
				continue // the example's pods run as their namespace's default
			}
			sa := w.spec.ServiceAccountName
			if sa == "" {
				t.Errorf("%s: no serviceAccountName", w.name)
			} else if o.serviceAccounts[key{w.ns, sa}] == nil {
				t.Errorf("%s: ServiceAccount %s/%s is not in the manifests", w.name, w.ns, sa)
			}
		}
		check := func(binding string, subjects []rbacv1.Subject) {
			if len(subjects) == 0 {
				t.Errorf("%s: no subjects", binding)
			}
			for _, s := range subjects {
				if s.Kind != rbacv1.ServiceAccountKind {
					t.Errorf("%s: subject %s %s; only ServiceAccounts are bound here", binding, s.Kind, s.Name)
				} else if o.serviceAccounts[key{s.Namespace, s.Name}] == nil {
					t.Errorf("%s: ServiceAccount %s/%s is not in the manifests", binding, s.Namespace, s.Name)
				}
			}
		}
		for _, b := range o.roleBindings {
			name := "RoleBinding " + b.Namespace + "/" + b.Name
			check(name, b.Subjects)
			switch b.RoleRef.Kind {
			case "Role":
				if o.roles[key{b.Namespace, b.RoleRef.Name}] == nil {
					t.Errorf("%s: Role %s/%s is not in the manifests", name, b.Namespace, b.RoleRef.Name)
				}
			case "ClusterRole":
				if o.clusterRoles[b.RoleRef.Name] == nil {
					t.Errorf("%s: ClusterRole %s is not in the manifests", name, b.RoleRef.Name)
				}
			default:
				t.Errorf("%s: roleRef kind %q", name, b.RoleRef.Kind)
			}
		}
		for _, b := range o.clusterRoleBindings {
			name := "ClusterRoleBinding " + b.Name
			check(name, b.Subjects)
			if b.RoleRef.Kind != "ClusterRole" || o.clusterRoles[b.RoleRef.Name] == nil {
				t.Errorf("%s: ClusterRole %s is not in the manifests", name, b.RoleRef.Name)
			}
		}
	})

	t.Run("RBAC grants the sidecars what they ask for, the node plugin nothing", func(t *testing.T) {
		ctl := o.byMode(t, "controller")
		sa := key{ctl.ns, ctl.spec.ServiceAccountName}
		cluster, namespaced := o.rulesOf(sa)
		// What csi-attacher v4.8.0 and csi-provisioner v5.2.0 ask for in
		// their deploy/kubernetes/rbac.yaml, for a driver with
		// PUBLISH_UNPUBLISH_VOLUME and no snapshots or capacity tracking.
		type need struct{ group, resource, verbs string }
		for _, n := range []need{
			{"", "persistentvolumes", "get list watch create patch delete"},
			{"", "persistentvolumeclaims", "get list watch update"},
			{"", "events", "list watch create update patch"},
			{"", "nodes", "get list watch"},
			{"storage.k8s.io", "storageclasses", "get list watch"},
			{"storage.k8s.io", "csinodes", "get list watch"},
			{"storage.k8s.io", "volumeattachments", "get list watch patch"},
			{"storage.k8s.io", "volumeattachments/status", "patch"},
		} {
			for _, v := range strings.Fields(n.verbs) {
				if !allows(cluster, n.group, n.resource, v) {
					t.Errorf("ServiceAccount %s may not %s %s cluster-wide", sa, v, path.Join(n.group, n.resource))
				}
			}
		}
		for _, v := range strings.Fields("get list watch create update delete") {
			if !allows(namespaced[sa.ns], "coordination.k8s.io", "leases", v) {
				t.Errorf("ServiceAccount %s may not %s leases in %s (leader election)", sa, v, sa.ns)
			}
		}
		for _, r := range slices.Concat(cluster, namespaced[sa.ns]) {
			if slices.Contains(r.Verbs, "*") || slices.Contains(r.Resources, "*") || slices.Contains(r.APIGroups, "*") {
				t.Errorf("ServiceAccount %s: a wildcard rule %v", sa, r)
			}
		}
		node := o.byMode(t, "node")
		nsa := key{node.ns, node.spec.ServiceAccountName}
		if c, n := o.rulesOf(nsa); len(c) > 0 || len(n) > 0 {
			t.Errorf("ServiceAccount %s (node plugin) is bound to roles; it needs no API access", nsa)
		}
		if a := o.serviceAccounts[nsa]; a != nil && (a.AutomountServiceAccountToken == nil || *a.AutomountServiceAccountToken) {
			t.Errorf("ServiceAccount %s (node plugin) has its token mounted; it needs none", nsa)
		}
	})

	t.Run("namespaces", func(t *testing.T) {
		if o.namespaces[systemNamespace] == nil {
			t.Errorf("no Namespace %s", systemNamespace)
		}
		for _, m := range o.all {
			ns := m.meta().GetNamespace()
			want := systemNamespace
			if strings.HasPrefix(m.file, "example/") {
				want = tenantNamespace
			}
			if clusterScoped[m.kind()] {
				want = ""
			}
			if ns != want {
				t.Errorf("%s: namespace %q, want %q", m, ns, want)
			}
		}
		for _, b := range o.clusterRoleBindings {
			for _, s := range b.Subjects {
				if s.Namespace != systemNamespace {
					t.Errorf("ClusterRoleBinding %s: subject in namespace %q", b.Name, s.Namespace)
				}
			}
		}
	})

	t.Run("images name no registry host", func(t *testing.T) {
		n := 0
		for _, w := range o.workloads() {
			for _, c := range allContainers(w.spec) {
				n++
				img := c.Image
				if img == "" {
					t.Errorf("%s: %s has no image", w.name, c.Name)
				}
				if first, _, ok := strings.Cut(img, "/"); ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
					t.Errorf("%s: %s's image %s names the registry %s; operators prefix their own mirror", w.name, c.Name, img, first)
				}
			}
		}
		if n == 0 {
			t.Error("no containers")
		}
	})

	t.Run("pods use claims that exist, block ones as devices", func(t *testing.T) {
		for _, p := range o.pods {
			for _, c := range allContainers(&p.Spec) {
				for _, d := range c.VolumeDevices {
					if v := volume(&p.Spec, d.Name); v == nil || v.PersistentVolumeClaim == nil {
						t.Errorf("Pod %s/%s: device %s is no claim of the pod", p.Namespace, p.Name, d.Name)
					}
				}
				for _, m := range c.VolumeMounts {
					if v := volume(&p.Spec, m.Name); v != nil && v.PersistentVolumeClaim != nil {
						t.Errorf("Pod %s/%s: claim %s is mounted; the driver's volumes are raw block (volumeDevices)", p.Namespace, p.Name, m.Name)
					}
				}
			}
			for _, v := range p.Spec.Volumes {
				if v.PersistentVolumeClaim == nil {
					continue
				}
				pvc := o.pvcs[key{p.Namespace, v.PersistentVolumeClaim.ClaimName}]
				if pvc == nil {
					t.Errorf("Pod %s/%s: PVC %s is not in the manifests", p.Namespace, p.Name, v.PersistentVolumeClaim.ClaimName)
				} else if slices.Equal(pvc.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}) && !v.PersistentVolumeClaim.ReadOnly {
					t.Errorf("Pod %s/%s: the ReadOnlyMany claim %s is not readOnly in the pod", p.Namespace, p.Name, pvc.Name)
				}
			}
		}
	})
}

// rulesOf returns the rules bound to a ServiceAccount: cluster-wide ones
// (ClusterRoleBindings) and, by namespace, namespaced ones (RoleBindings).
func (o *objects) rulesOf(sa key) ([]rbacv1.PolicyRule, map[string][]rbacv1.PolicyRule) {
	is := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Namespace == sa.ns && s.Name == sa.name
		})
	}
	var cluster []rbacv1.PolicyRule
	namespaced := map[string][]rbacv1.PolicyRule{}
	for _, b := range o.clusterRoleBindings {
		if r := o.clusterRoles[b.RoleRef.Name]; is(b.Subjects) && r != nil {
			cluster = append(cluster, r.Rules...)
		}
	}
	for _, b := range o.roleBindings {
		if !is(b.Subjects) {
			continue
		}
		if r := o.roles[key{b.Namespace, b.RoleRef.Name}]; b.RoleRef.Kind == "Role" && r != nil {
			namespaced[b.Namespace] = append(namespaced[b.Namespace], r.Rules...)
		}
		if r := o.clusterRoles[b.RoleRef.Name]; b.RoleRef.Kind == "ClusterRole" && r != nil {
			namespaced[b.Namespace] = append(namespaced[b.Namespace], r.Rules...)
		}
	}
	return cluster, namespaced
}

// allows reports whether a rule grants verb on group/resource.
func allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	match := func(list []string, v string) bool { return slices.Contains(list, v) || slices.Contains(list, "*") }
	for _, r := range rules {
		if len(r.ResourceNames) == 0 && match(r.APIGroups, group) && match(r.Resources, resource) && match(r.Verbs, verb) {
			return true
		}
	}
	return false
}

// gatewayServices decodes the gateway's manifest strictly and returns its
// Services' ports by namespace and name.
func gatewayServices(t *testing.T) map[key][]string {
	t.Helper()
	data, err := os.ReadFile(gatewayManifest)
	if err != nil {
		t.Fatal(err)
	}
	out := map[key][]string{}
	for _, m := range decodeFile(t, gatewayManifest, string(data)) {
		if s, ok := m.obj.(*corev1.Service); ok {
			for _, p := range s.Spec.Ports {
				out[key{s.Namespace, s.Name}] = append(out[key{s.Namespace, s.Name}], strconv.Itoa(int(p.Port)))
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no Service", gatewayManifest)
	}
	keys := make([]string, 0, len(out))
	for k := range out {
		keys = append(keys, k.String())
	}
	sort.Strings(keys)
	t.Logf("%s: Services %v", gatewayManifest, keys)
	return out
}
