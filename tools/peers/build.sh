#!/usr/bin/env bash
# Build (or reuse) the Go provisioners the benchmark compares with, from the Go module proxy:
#   seed-hostpath          the seed library v8.0.0 (pinned by seed-hostpath/go.mod, go.sum)
#                          with a hostPath main of ours (the proxy does not serve the seed's
#                          examples/hostpath-provisioner module);
#   local-path-provisioner rancher/local-path-provisioner at $LOCAL_PATH_VERSION.
# nfs-subdir-external-provisioner is not built: the proxy refuses every version of it
# (docs/decisions/0016-peers-from-the-module-proxy.md).
# Built once per machine into ${SPLIT_PROVISIONER_CACHE:-$HOME/.cache/split-provisioner}/peers/
# <pin checksum>/bin and linked into <target dir>/peers/bin, whose path is the last line of
# stdout. Without Go it prints nothing and exits 0, unless CI=true: then it fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
LOCAL_PATH_VERSION=v0.0.30
fail() { echo "peers build: $*" >&2; exit 1; }

export PATH=/usr/local/go/bin:$PATH
if ! command -v go >/dev/null 2>&1; then
  [ "${CI:-}" = true ] && fail "Go is needed to build the peer provisioners (expected /usr/local/go)"
  echo "peers build: no Go on this machine; the peer benchmarks and drop-in tests are skipped" >&2
  exit 0
fi
cache=${SPLIT_PROVISIONER_CACHE:-$HOME/.cache/split-provisioner}
recipe=1
key=$( (echo "recipe $recipe local-path $LOCAL_PATH_VERSION"; cat "$here"/seed-hostpath/{go.mod,go.sum,main.go}) \
  | sha256sum | cut -c1-16)
out=$cache/peers/$key
target=${CARGO_TARGET_DIR:-target}
case "$target" in /*) ;; *) target=$repo/$target ;; esac
dest=$target/peers/bin
tools=(seed-hostpath local-path-provisioner)

mkdir -p "$cache/peers"
exec 9>"$cache/peers/.lock"
flock 9
if [ -f "$out/.complete" ]; then
  echo "peers build: reusing $out" >&2
else
  export GOMODCACHE=$cache/go/mod GOCACHE=$cache/go/build GOFLAGS="-buildvcs=false"
  export CGO_ENABLED=0 GOTOOLCHAIN=local
  start=$(date +%s)
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp/bin"
  (cd "$here/seed-hostpath" && GOFLAGS="$GOFLAGS -mod=readonly" \
    nice -n 10 go build -trimpath -ldflags "-s -w" -o "$out.tmp/bin/seed-hostpath" .)
  GOBIN=$out.tmp/bin nice -n 10 go install -trimpath -ldflags "-s -w" \
    "github.com/rancher/local-path-provisioner@$LOCAL_PATH_VERSION"
  echo "built in $(($(date +%s) - start)) s on $(nproc) cores" > "$out.tmp/.complete"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  echo "peers build: $(cat "$out/.complete")" >&2
fi
mkdir -p "$dest"
for tool in "${tools[@]}"; do
  [ -x "$out/bin/$tool" ] || fail "$out/bin/$tool is missing (remove $out to rebuild)"
  ln -sfn "$out/bin/$tool" "$dest/$tool"
done
echo "$dest"
