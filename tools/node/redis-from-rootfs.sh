#!/usr/bin/env bash
# Print a directory whose redis-server and redis-cli run the Redis of the node image's
# Debian 13 root filesystem (tools/node/images.sh builds it) on this host, through that
# root's own loader and libraries; for running the queue's tests on the shipped Redis.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${SPLIT_PROVISIONER_CACHE:-$HOME/.cache/split-provisioner}
root=$cache/node/rootfs/redis-trixie-1
[ -e "$root.complete" ] || { echo "redis-from-rootfs: no $root (run tools/node/images.sh)" >&2; exit 1; }
target=${CARGO_TARGET_DIR:-target}
case "$target" in /*) ;; *) target=$repo/$target ;; esac
out=$target/node/redis-rootfs-bin
mkdir -p "$out"
libs=$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu
for tool in redis-server redis-cli; do
  # redis-server is a relative symlink to redis-check-rdb; argv0 picks the mode.
  binary=$(basename "$(readlink "$root/usr/bin/$tool" || echo "$tool")")
  printf '#!/bin/sh\nexec %s --library-path %s --argv0 %s %s "$@"\n' \
    "$root/lib64/ld-linux-x86-64.so.2" "$libs" "$tool" "$root/usr/bin/$binary" > "$out/$tool"
  chmod +x "$out/$tool"
done
"$out/redis-server" --version >&2
echo "$out"
