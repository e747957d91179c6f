module split-provisioner/tools/peers/seed-hostpath

go 1.16

require (
	k8s.io/api v0.19.1
	k8s.io/apimachinery v0.19.1
	k8s.io/client-go v0.19.1
	k8s.io/klog/v2 v2.3.0
	sigs.k8s.io/sig-storage-lib-external-provisioner/v8 v8.0.0
)
