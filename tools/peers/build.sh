#!/usr/bin/env bash
# Build (or reuse) the Go provisioners the benchmark and the drop-in tests compare with:
#   seed-hostpath          the seed library v8.0.0 (pinned by seed-hostpath/go.mod, go.sum)
#                          with a hostPath main of ours (the proxy does not serve the seed's
#                          examples/hostpath-provisioner module);
#   local-path-provisioner rancher/local-path-provisioner at $LOCAL_PATH_VERSION.
# nfs-subdir-external-provisioner is not built: the proxy refuses every version of it
# (docs/decisions/0011-peers-from-the-module-proxy.md).
# Built once per machine into ${SPLIT_PROVISIONER_CACHE:-$HOME/.cache/split-provisioner}/peers/
# <pin checksum>/bin and linked into <target dir>/peers/bin, whose path is the last line of
# stdout. Without Go it prints nothing and exits 0, unless CI=true: then it fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/tools/lib/go-cache.sh"
LOCAL_PATH_VERSION=v0.0.30
go_cache_init "peers build" "the peer benchmarks and drop-in tests are skipped"

recipe=1
key=$( (echo "recipe $recipe local-path $LOCAL_PATH_VERSION"; cat "$here"/seed-hostpath/{go.mod,go.sum,main.go}) \
  | sha256sum | cut -c1-16)

build_into() {
  (cd "$here/seed-hostpath" && nice -n 10 go build -trimpath -ldflags "-s -w" -o "$1/bin/seed-hostpath" .)
  # `go install pkg@version` builds with the module's own go.sum; -mod does not apply.
  GOFLAGS=-buildvcs=false GOBIN=$1/bin nice -n 10 go install -trimpath -ldflags "-s -w" \
    "github.com/rancher/local-path-provisioner@$LOCAL_PATH_VERSION"
}
go_cache_build peers "$key" peers/bin seed-hostpath local-path-provisioner
