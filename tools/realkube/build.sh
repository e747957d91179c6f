#!/usr/bin/env bash
# Build (or reuse) a pinned Kubernetes control plane for e2e::realkube from the Go module proxy:
#   kube-apiserver, kube-controller-manager, kube-scheduler and etcd, as pinned (versions and
#   checksums) by tools/realkube/<version>/go.mod and go.sum.
# Usage: tools/realkube/build.sh [VERSION]   (VERSION defaults to v1.37.2; a folder beside this script)
#
# The binaries are built once per machine into
#   ${SPLIT_PROVISIONER_CACHE:-$HOME/.cache/split-provisioner}/realkube/<version>-<pin checksum>/bin
# (with the Go module and build caches beside them, outside any clone) and linked into the
# clone's <target dir>/realkube/<version>/bin, whose path is printed as the last line of stdout.
# Without Go (/usr/local/go/bin or PATH) it prints nothing and exits 0, unless CI=true: then it fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/tools/lib/go-cache.sh"
version=${1:-v1.37.2}
pins=$here/$version
[ -f "$pins/go.mod" ] && [ -f "$pins/go.sum" ] || { echo "realkube build: no pins for $version in $pins (go.mod, go.sum)" >&2; exit 1; }
go_cache_init "realkube build" "the $version real-plane tests will be skipped"

# The pin checksum: the pins, the etcd entry point and the build recipe (bump it when the
# go build flags below change).
recipe=1
key=$( (echo "recipe $recipe"; cat "$pins/go.mod" "$pins/go.sum" "$pins/etcd/main.go") | sha256sum | cut -c1-16)

build_into() {
  echo "realkube build: a cold build takes tens of minutes" >&2
  (
    cd "$pins"
    go mod download
    # go.sum must already hold every checksum: -mod=readonly refuses to add one.
    nice -n 10 go build -trimpath -ldflags "$(k8s_ldflags "$version")" -o "$1/bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler
    nice -n 10 go build -trimpath -ldflags "-s -w" -o "$1/bin/etcd" ./etcd
  )
  "$1/bin/kube-apiserver" --version >&2
  "$1/bin/etcd" --version | head -1 >&2
}
go_cache_build realkube "$version-$key" "realkube/$version/bin" \
  kube-apiserver kube-controller-manager kube-scheduler etcd
