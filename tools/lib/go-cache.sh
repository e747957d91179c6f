# Shared by tools/{realkube,node,peers}/build.sh (sourced): Go binaries built once per machine
# from the Go module proxy into ${SPLIT_PROVISIONER_CACHE:-$HOME/.cache/split-provisioner}/<kind>/
# <name>, with the module and build caches beside them, then linked into the clone.

# go_cache_init LABEL WHAT: `go` on PATH and $cache set; without Go, print that WHAT is skipped
# and exit 0, or fail under CI=true.
go_cache_init() {
  label=$1
  export PATH=/usr/local/go/bin:$PATH
  cache=${SPLIT_PROVISIONER_CACHE:-$HOME/.cache/split-provisioner}
  if ! command -v go >/dev/null 2>&1; then
    [ "${CI:-}" = true ] && { echo "$label: Go is needed (expected /usr/local/go)" >&2; exit 1; }
    echo "$label: no Go on this machine; $2" >&2
    exit 0
  fi
}

# k8s_ldflags VERSION: the linker flags that stamp a Kubernetes release into its binaries.
k8s_ldflags() {
  local version=$1 minor pkg flags="-s -w"
  minor=${version#v1.}; minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean"
  done
  echo "$flags"
}

# go_cache_build KIND NAME LINK TOOL...: unless $cache/KIND/NAME is complete, run the caller's
# `build_into DIR` (each TOOL into DIR/bin) under a per-KIND lock; then link every TOOL into
# <target dir>/LINK and print that directory.
go_cache_build() {
  local kind=$1 name=$2 link=$3 out target dest start tool
  shift 3
  out=$cache/$kind/$name
  target=${CARGO_TARGET_DIR:-target}
  case "$target" in /*) ;; *) target=$repo/$target ;; esac
  dest=$target/$link
  mkdir -p "$cache/$kind"
  exec 9>"$cache/$kind/.lock"
  flock 9
  if [ -f "$out/.complete" ]; then
    echo "$label: reusing $out" >&2
  else
    export GOMODCACHE=$cache/go/mod GOCACHE=$cache/go/build GOFLAGS="-mod=readonly -buildvcs=false"
    export CGO_ENABLED=0 GOTOOLCHAIN=local
    echo "$label: building into $out" >&2
    start=$(date +%s)
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp/bin"
    build_into "$out.tmp"
    echo "built in $(($(date +%s) - start)) s on $(nproc) cores" > "$out.tmp/.complete"
    rm -rf "$out"
    mv "$out.tmp" "$out"
    echo "$label: $(cat "$out/.complete")" >&2
  fi
  mkdir -p "$dest"
  for tool in "$@"; do
    [ -x "$out/bin/$tool" ] || { echo "$label: $out/bin/$tool is missing (remove $out to rebuild)" >&2; exit 1; }
    ln -sfn "$out/bin/$tool" "$dest/$tool"
  done
  echo "$dest"
}
