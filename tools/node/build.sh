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
version=${1:-v1.37.2}
pins=$here/$version
fail() { echo "node build: $*" >&2; exit 1; }
[ -f "$pins/go.mod" ] && [ -f "$pins/go.sum" ] || fail "no pins for $version in $pins (go.mod, go.sum)"

export PATH=/usr/local/go/bin:$PATH
if ! command -v go >/dev/null 2>&1; then
  [ "${CI:-}" = true ] && fail "Go is needed to build the $version node (expected /usr/local/go)"
  echo "node build: no Go on this machine; the node scenarios will be skipped" >&2
  exit 0
fi

cache=${SPLIT_PROVISIONER_CACHE:-$HOME/.cache/split-provisioner}
# The pin checksum: the pins and this recipe (bump it when the build commands below change).
recipe=1
key=$( (echo "recipe $recipe"; cat "$pins/go.mod" "$pins/go.sum" "$here/coredns/go.mod" \
  "$here/coredns/go.sum" "$here/coredns/main.go") | sha256sum | cut -c1-16)
out=$cache/node/$version-$key
target=${CARGO_TARGET_DIR:-target}
case "$target" in /*) ;; *) target=$repo/$target ;; esac
dest=$target/node/$version/bin
tools=(kubelet kube-proxy coredns pause)

mkdir -p "$cache/node"
exec 9>"$cache/node/.lock"
flock 9
if [ -f "$out/.complete" ]; then
  echo "node build: reusing $out" >&2
else
  # The same module and build caches as tools/realkube/build.sh: most packages are shared.
  export GOMODCACHE=$cache/go/mod GOCACHE=$cache/go/build GOFLAGS="-mod=readonly -buildvcs=false"
  export CGO_ENABLED=0 GOTOOLCHAIN=local
  minor=${version#v1.}; minor=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean"
  done
  echo "node build: building $version node binaries into $out" >&2
  start=$(date +%s)
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp/bin"
  (
    cd "$pins"
    go mod download
    nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$out.tmp/bin/" \
      k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
    src=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)
    nice -n 10 cc -Os -static -DVERSION="$version" -o "$out.tmp/bin/pause" "$src/build/pause/linux/pause.c"
    strip "$out.tmp/bin/pause"
  )
  (
    cd "$here/coredns"
    go mod download
    nice -n 10 go build -trimpath -ldflags "-s -w" -o "$out.tmp/bin/coredns" .
  )
  "$out.tmp/bin/kubelet" --version >&2
  "$out.tmp/bin/coredns" -version | head -1 >&2
  echo "built in $(($(date +%s) - start)) s on $(nproc) cores" > "$out.tmp/.complete"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  echo "node build: $(cat "$out/.complete")" >&2
fi
mkdir -p "$dest"
for tool in "${tools[@]}"; do
  [ -x "$out/bin/$tool" ] || fail "$out/bin/$tool is missing (remove $out to rebuild)"
  ln -sfn "$out/bin/$tool" "$dest/$tool"
done
echo "$dest"
