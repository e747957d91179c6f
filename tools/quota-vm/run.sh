#!/usr/bin/env bash
# Boot Debian's own kernel in qemu with an XFS and an ext4 image (project quotas on) and run
# PROBE (tests/src/bin/quota-probe.rs) against both: real quota enforcement where the host
# kernel has none (docs/decisions/0014-sizes-enforced-with-project-quotas.md).
# Usage: cargo build -p e2e --bin quota-probe && tools/quota-vm/run.sh target/debug/quota-probe
# (or `cargo test -p e2e --test quota_vm`) -> the VM's serial log on stdout; exit 0 iff it passed.
# x86_64 Debian host with an apt source for linux-image-amd64 (network on the first run).
# Needs: qemu-system-x86, xfsprogs, e2fsprogs, busybox-static, cpio, kmod (Debian packages);
# the kernel package is downloaded once per machine into ${SPLIT_PROVISIONER_CACHE}.
set -euo pipefail
probe=$(realpath "$1")
cache=${SPLIT_PROVISIONER_CACHE:-$HOME/.cache/split-provisioner}/quota-vm
work=$(mktemp -d "${TMPDIR:-/tmp}/quota-vm.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The kernel: the image linux-image-amd64 depends on, unpacked once (no install, /boot untouched).
mkdir -p "$cache"
kernel_pkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
pkg=$(kernel_pkg)
[ -n "$pkg" ] || { apt-get update -qq >/dev/null 2>&1 || true; pkg=$(kernel_pkg); }
[ -n "$pkg" ] || { echo "quota-vm: no linux-image package known to apt" >&2; exit 2; }
kver=${pkg#linux-image-}
kdir=$cache/$kver
if [ ! -f "$kdir/ready" ]; then
  rm -rf "$kdir" && mkdir -p "$kdir"
  (cd "$work" && apt-get download -q "$pkg" >/dev/null 2>&1) || { echo "quota-vm: apt-get download $pkg failed" >&2; exit 2; }
  dpkg-deb -x "$work"/"$pkg"_*.deb "$kdir"
  depmod -b "$kdir" "$kver"
  touch "$kdir/ready"
fi

# The initramfs: busybox, the probe with its shared libraries, the modules, /init.
root=$work/root
mkdir -p "$root"/{bin,proc,sys,dev,mnt/xfs,mnt/ext4}
cp /bin/busybox "$root/bin/busybox"
ln -s busybox "$root/bin/sh"
cp "$probe" "$root/bin/quota-probe"
for lib in $(ldd "$probe" | grep -o '/[^ ]*'); do
  mkdir -p "$root$(dirname "$lib")" && cp -L "$lib" "$root$lib"
done
modules=()
for m in virtio_pci virtio_blk xfs ext4 quota_v2; do
  while read -r f; do modules+=("$f"); done < <(modprobe -d "$kdir" -S "$kver" --show-depends "$m" | awk '$1=="insmod"{print $2}')
done
order=()
for f in "${modules[@]}"; do
  case " ${order[*]} " in *" $f "*) ;; *) order+=("$f") ;; esac
done
mkdir -p "$root/lib/modules"
: > "$root/modules"
for f in "${order[@]}"; do
  cp "$f" "$root/lib/modules/"
  basename "$f" >> "$root/modules"
done
cat > "$root/init" <<'EOF'
#!/bin/sh
export PATH=/bin
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
while read -r m; do insmod "/lib/modules/$m" 2>/dev/null; done < /modules
i=0; while [ ! -b /dev/vdb ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
mount -t xfs -o prjquota /dev/vda /mnt/xfs && mount -t ext4 -o prjquota /dev/vdb /mnt/ext4 \
  && /bin/quota-probe /mnt/xfs:xfs /mnt/ext4:ext4
sync; umount /mnt/xfs /mnt/ext4 2>/dev/null
poweroff -f
EOF
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initramfs.gz"

# The filesystems: XFS (mkfs.xfs wants at least 300 MB; sparse) and ext4 with project quotas.
truncate -s 300M "$work/xfs.img" && mkfs.xfs -q "$work/xfs.img"
truncate -s 64M "$work/ext4.img" && mkfs.ext4 -q -F -O quota,project "$work/ext4.img"

# KVM when the CPU offers it, else qemu's own emulation (about 7 s here).
if grep -qwE 'vmx|svm' /proc/cpuinfo && [ -w /dev/kvm ]; then accel=(-enable-kvm -cpu host); else accel=(-accel tcg -cpu max); fi
timeout 300 qemu-system-x86_64 "${accel[@]}" -m 512 -nographic -no-reboot \
  -kernel "$kdir/boot/vmlinuz-$kver" -initrd "$work/initramfs.gz" \
  -append "console=ttyS0 panic=-1 quiet" \
  -drive file="$work/xfs.img",format=raw,if=virtio \
  -drive file="$work/ext4.img",format=raw,if=virtio > "$work/serial.log" 2>&1 || true
tr -d '\r' < "$work/serial.log"
grep -q '^QUOTA-PROBE PASS' <(tr -d '\r' < "$work/serial.log")
