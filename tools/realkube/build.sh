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
version=${1:-v1.37.2}
pins=$here/$version
fail() { echo "realkube build: $*" >&2; exit 1; }
[ -f "$pins/go.mod" ] && [ -f "$pins/go.sum" ] || fail "no pins for $version in $pins (go.mod, go.sum)"

export PATH=/usr/local/go/bin:$PATH
if ! command -v go >/dev/null 2>&1; then
  [ "${CI:-}" = true ] && fail "Go is needed to build the $version control plane (expected /usr/local/go)"
  echo "realkube build: no Go on this machine; the $version real-plane tests will be skipped" >&2
  exit 0
fi

cache=${SPLIT_PROVISIONER_CACHE:-$HOME/.cache/split-provisioner}
# The pin checksum: the pins, the etcd entry point and the build recipe (bump it when the
# go build flags below change).
recipe=1
key=$( (echo "recipe $recipe"; cat "$pins/go.mod" "$pins/go.sum" "$pins/etcd/main.go") | sha256sum | cut -c1-16)
out=$cache/realkube/$version-$key
target=${CARGO_TARGET_DIR:-target}
case "$target" in /*) ;; *) target=$repo/$target ;; esac
dest=$target/realkube/$version/bin
tools=(kube-apiserver kube-controller-manager kube-scheduler etcd)

mkdir -p "$cache/realkube"
exec 9>"$cache/realkube/.lock"
flock 9
if [ -f "$out/.complete" ]; then
  echo "realkube build: reusing $out" >&2
else
  export GOMODCACHE=$cache/go/mod GOCACHE=$cache/go/build GOFLAGS="-mod=readonly -buildvcs=false"
  export CGO_ENABLED=0 GOTOOLCHAIN=local
  minor=${version#v1.}; minor=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean"
  done
  echo "realkube build: building $version into $out (a cold build takes tens of minutes)" >&2
  start=$(date +%s)
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp/bin"
  (
    cd "$pins"
    go mod download
    # go.sum must already hold every checksum: -mod=readonly refuses to add one.
    nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$out.tmp/bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler
    nice -n 10 go build -trimpath -ldflags "-s -w" -o "$out.tmp/bin/etcd" ./etcd
  )
  "$out.tmp/bin/kube-apiserver" --version >&2
  "$out.tmp/bin/etcd" --version | head -1 >&2
  echo "built in $(($(date +%s) - start)) s on $(nproc) cores" > "$out.tmp/.complete"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  echo "realkube build: $(cat "$out/.complete")" >&2
fi
mkdir -p "$dest"
for tool in "${tools[@]}"; do
  [ -x "$out/bin/$tool" ] || fail "$out/bin/$tool is missing (remove $out to rebuild)"
  ln -sfn "$out/bin/$tool" "$dest/$tool"
done
echo "$dest"
