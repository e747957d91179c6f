// seed-hostpath: the seed library (sig-storage-lib-external-provisioner v8.0.0, from the Go
// module proxy) driving a hostPath provisioner with the layout of its
// examples/hostpath-provisioner (one directory <dir>/<PV name>, the PV annotated with the
// provisioner's identity, Delete only of its own volumes). Written here because the proxy does
// not serve that example (a module of its own); unlike the example it takes a kubeconfig, so
// the benchmark can run it beside the services on the same control plane.
package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v8/controller"
)

const identityAnnotation = "hostPathProvisionerIdentity"

type hostPath struct {
	dir      string
	identity string
}

func (p *hostPath) Provision(_ context.Context, o controller.ProvisionOptions) (*v1.PersistentVolume, controller.ProvisioningState, error) {
	path := filepath.Join(p.dir, o.PVName)
	if err := os.MkdirAll(path, 0o777); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        o.PVName,
			Annotations: map[string]string{identityAnnotation: p.identity},
		},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: *o.StorageClass.ReclaimPolicy,
			AccessModes:                   o.PVC.Spec.AccessModes,
			Capacity: v1.ResourceList{
				v1.ResourceStorage: o.PVC.Spec.Resources.Requests[v1.ResourceStorage],
			},
			PersistentVolumeSource: v1.PersistentVolumeSource{
				HostPath: &v1.HostPathVolumeSource{Path: path},
			},
		},
	}
	return pv, controller.ProvisioningFinished, nil
}

func (p *hostPath) Delete(_ context.Context, pv *v1.PersistentVolume) error {
	if pv.Annotations[identityAnnotation] != p.identity {
		return &controller.IgnoredError{Reason: "identity annotation on PV does not match ours"}
	}
	if pv.Spec.HostPath == nil {
		return errors.New("PV has no hostPath source")
	}
	return os.RemoveAll(filepath.Join(p.dir, pv.Name))
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file; in-cluster config when empty")
	name := flag.String("provisioner", "example.com/hostpath", "provisioner name")
	dir := flag.String("dir", "/tmp/hostpath-provisioner", "directory the volumes are made in")
	identity := flag.String("identity", os.Getenv("NODE_NAME"), "identity written on each PV (default $NODE_NAME)")
	threads := flag.Int("worker-threads", 4, "claims and volumes processed at once (the library's default)")
	leaderElection := flag.Bool("leader-elect", true, "campaign for the library's leader lock")
	qps := flag.Float64("kube-api-qps", 5, "client-side request limit (client-go's default); negative: none")
	burst := flag.Int("kube-api-burst", 10, "client-side burst (client-go's default)")
	klog.InitFlags(nil)
	flag.Parse()
	if *identity == "" {
		klog.Fatal("--identity or NODE_NAME must name this provisioner")
	}
	var config *rest.Config
	var err error
	if *kubeconfig == "" {
		config, err = rest.InClusterConfig()
	} else {
		config, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	}
	if err != nil {
		klog.Fatalf("client config: %v", err)
	}
	config.QPS, config.Burst = float32(*qps), *burst
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}
	p := &hostPath{dir: *dir, identity: *identity}
	pc := controller.NewProvisionController(client, *name, p,
		controller.Threadiness(*threads), controller.LeaderElection(*leaderElection))
	pc.Run(context.Background())
}
