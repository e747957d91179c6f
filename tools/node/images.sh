#!/usr/bin/env bash
# Build the node scenarios' container images offline (no registry) as OCI archives that
# `ctr -n k8s.io images import` reads, into <target dir>/node/images/ (paths printed on stdout):
#   split-provisioner.tar  docker.io/library/split-provisioner:node-test — the Dockerfile's image:
#                          the three service binaries and provisioner-ctl (cargo profile $IMAGE_PROFILE, default
#                          dist) in /usr/local/bin on a Debian 12 minbase with CA certificates,
#                          user 65532:65532;
#   redis.tar              docker.io/library/redis:node-test — Debian 13's redis-server and
#                          redis-cli (Debian 12's 7.0 rejects the ACL's Redis 7.2 commands;
#                          docs/decisions/0010), also the scenarios' workload image;
#   pause.tar              registry.k8s.io/pause:3.10 — tools/node/build.sh's pause, user 65535.
# The Debian root filesystems come from debootstrap (Debian's mirror), once per machine, in
# ${SPLIT_PROVISIONER_CACHE:-$HOME/.cache/split-provisioner}/node/rootfs. Needs root.
# Usage: tools/node/images.sh NODE_BIN_DIR   (the directory tools/node/build.sh printed)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
node_bin=${1:?usage: images.sh NODE_BIN_DIR}
fail() { echo "node images: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "debootstrap needs root"
command -v debootstrap >/dev/null || fail "debootstrap is missing (apt-get install debootstrap)"
profile=${IMAGE_PROFILE:-dist}
profile_dir=$profile
[ "$profile" = dev ] && profile_dir=debug
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${SPLIT_PROVISIONER_CACHE:-$HOME/.cache/split-provisioner}
target=${CARGO_TARGET_DIR:-target}
case "$target" in /*) ;; *) target=$repo/$target ;; esac
out=$target/node/images
mkdir -p "$out" "$cache/node/rootfs"

# rootfs NAME PACKAGES SUITE: a Debian minbase with PACKAGES, built once (apt lists and caches dropped).
rootfs() {
  local dir=$cache/node/rootfs/$1-$3-1
  if [ ! -f "$dir.complete" ]; then
    echo "node images: debootstrap $1 ($2)" >&2
    rm -rf "$dir.tmp"
    debootstrap --variant=minbase --include="$2" "$3" "$dir.tmp" "$mirror" >&2
    rm -rf "$dir.tmp"/var/cache/apt/* "$dir.tmp"/var/lib/apt/lists/* "$dir.tmp"/var/log/*
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
    touch "$dir.complete"
  fi
  echo "$dir"
}
exec 9>"$cache/node/rootfs/.lock"
flock 9
service_root=$(rootfs service ca-certificates bookworm)
redis_root=$(rootfs redis redis-server trixie)
flock -u 9

start=$(date +%s)
(cd "$repo" && cargo build --profile "$profile" --locked -p provision-svc -p pv-writer -p reclaim-svc -p provisioner-ctl >&2)
echo "node images: cargo build --profile $profile: $(($(date +%s) - start)) s" >&2
stage=$(mktemp -d "$out/stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin/usr/local/bin" "$stage/pause"
for b in provision-svc pv-writer reclaim-svc provisioner-ctl; do
  install -m 0755 "$target/$profile_dir/$b" "$stage/bin/usr/local/bin/$b"
done
install -m 0755 "$node_bin/pause" "$stage/pause/pause"

py=$here/oci-image.py
python3 "$py" --name docker.io/library/split-provisioner:node-test --out "$out/split-provisioner.tar" \
  --user 65532:65532 --cmd '["provision-svc","--help"]' "$service_root" "$stage/bin" >&2
python3 "$py" --name docker.io/library/redis:node-test --out "$out/redis.tar" \
  --cmd '["redis-server"]' "$redis_root" >&2
python3 "$py" --name registry.k8s.io/pause:3.10 --out "$out/pause.tar" \
  --user 65535:65535 --entrypoint '["/pause"]' "$stage/pause" >&2
echo "node images: packed in $(($(date +%s) - start)) s" >&2
ls "$out"/*.tar
