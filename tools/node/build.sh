#!/usr/bin/env bash
# Build (or reuse) the pinned binaries of a single real node for the node scenarios:
#   kubelet and kube-proxy (pins in tools/node/<version>/go.mod, the control plane's release),
#   CoreDNS (pins in tools/node/coredns/go.mod) and the pause program (pause.c of the same
#   k8s.io/kubernetes module, linked statically).
# Usage: tools/node/build.sh [VERSION]   (VERSION defaults to v1.37.2)
#
# Built once per machine into
#   ${SPLIT_PROVISIONER_CACHE:-$HOME/.cache/split-provisioner}/node/<version>-<pin checksum>/bin
# and linked into the clone's <target dir>/node/<version>/bin, printed as the last stdout line.
# containerd, runc and the CNI plugins are Debian's (containerd, runc, containernetworking-plugins).
# Without Go it prints nothing and exits 0, unless CI=true: then it fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/tools/lib/go-cache.sh"
version=${1:-v1.37.2}
pins=$here/$version
[ -f "$pins/go.mod" ] && [ -f "$pins/go.sum" ] || { echo "node build: no pins for $version in $pins (go.mod, go.sum)" >&2; exit 1; }
go_cache_init "node build" "the node scenarios will be skipped"

# The pin checksum: the pins and this recipe (bump it when the build commands below change).
recipe=1
key=$( (echo "recipe $recipe"; cat "$pins/go.mod" "$pins/go.sum" "$here/coredns/go.mod" \
  "$here/coredns/go.sum" "$here/coredns/main.go") | sha256sum | cut -c1-16)

# The same module and build caches as tools/realkube/build.sh: most packages are shared.
build_into() {
  (
    cd "$pins"
    go mod download
    nice -n 10 go build -trimpath -ldflags "$(k8s_ldflags "$version")" -o "$1/bin/" \
      k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
    src=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)
    nice -n 10 cc -Os -static -DVERSION="$version" -o "$1/bin/pause" "$src/build/pause/linux/pause.c"
    strip "$1/bin/pause"
  )
  (
    cd "$here/coredns"
    go mod download
    nice -n 10 go build -trimpath -ldflags "-s -w" -o "$1/bin/coredns" .
  )
  "$1/bin/kubelet" --version >&2
  "$1/bin/coredns" -version | head -1 >&2
}
go_cache_build node "$version-$key" "node/$version/bin" kubelet kube-proxy coredns pause
