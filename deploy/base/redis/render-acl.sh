#!/bin/sh
# Render the Redis ACL file from users.acl (see its header) at pod start.
#   render-acl.sh TEMPLATE PASSWORD_DIR OUT
# PASSWORD_DIR holds one file per user (the mounted Secret
# split-provisioner-redis-users): the first line of `<user>` is its password,
# `<user>.previous` (optional) a second accepted password during a rotation.
# Env PROVISIONER_NAME (from split-provisioner-config) fills the key prefix.
# Only password hashes (`#<sha256>`) reach OUT. Hand-written because it is a
# dozen lines of POSIX sh that the Redis image can run as is.
set -eu
template=$1
secrets=$2
out=$3
name=${PROVISIONER_NAME:?PROVISIONER_NAME is not set}
case "$name" in
  *[!A-Za-z0-9./_-]*) echo "render-acl: PROVISIONER_NAME $name has characters outside [A-Za-z0-9./_-]" >&2; exit 1 ;;
esac
hash() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
tmp="$out.tmp"
: > "$tmp"
chmod 600 "$tmp"
grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$template" | while IFS= read -r line; do
  user=$(printf '%s\n' "$line" | cut -d' ' -f2)
  passwords=""
  for f in "$secrets/$user" "$secrets/$user.previous"; do
    [ -f "$f" ] || continue
    p=$(head -n 1 "$f")
    [ -n "$p" ] || continue
    passwords="$passwords #$(hash "$p")"
  done
  case "$line" in
    *'${PASSWORDS}'*)
      if [ -z "$passwords" ]; then
        echo "render-acl: no password for Redis user $user (file $secrets/$user)" >&2
        exit 1
      fi ;;
  esac
  random="#$(head -c 32 /dev/urandom | sha256sum | cut -d' ' -f1)"
  printf '%s\n' "$line" | sed -e "s|\${PASSWORDS}|${passwords# }|" \
    -e "s|\${RANDOM_PASSWORD}|$random|" \
    -e "s|\${PROVISIONER_NAME}|$name|g" >> "$tmp"
done
mv "$tmp" "$out"
