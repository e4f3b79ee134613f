#!/usr/bin/env bash
# Builds the microVM guest kernel (an uncompressed vmlinux with a PVH entry
# point) from Debian's linux-source package: `make tinyconfig`, then the
# fragment microvm.config merged over it. The result is cached under a key
# of the fragment, the source package's version and the compiler, so a
# machine builds it once (about 20 CPU-minutes) and every later
# `make guest-kernel` is a copy.
#
# usage: build.sh OUTPUT   (CUBICLE_KERNEL_CACHE overrides the cache dir)
set -euo pipefail
out=${1:?usage: build.sh OUTPUT}
here=$(cd "$(dirname "$0")" && pwd)
frag=$here/microvm.config
tarball=$(ls /usr/src/linux-source-*.tar.xz 2>/dev/null | sort -V | tail -1)
if [ -z "$tarball" ]; then
  echo "guest kernel: no /usr/src/linux-source-*.tar.xz (apt-get install linux-source-6.1)" >&2
  exit 1
fi
pkg=$(basename "$tarball" .tar.xz)
ver=$(dpkg-query -W -f='${Version}' "$pkg")
key=$( { echo "$pkg $ver"; gcc --version | head -1; cat "$frag"; } | sha256sum | cut -c1-16)
build() {
  local work=$1 keep=$2 line opt missing=0
  echo "guest kernel: building $pkg $ver (key $key) in $work"
  tar -xf "$tarball" -C "$work" --strip-components=1
  make -C "$work" -s tinyconfig
  (cd "$work" && scripts/kconfig/merge_config.sh -m .config "$frag" >/dev/null)
  make -C "$work" -s olddefconfig
  # Every option the fragment sets must have survived the dependency
  # resolution: a silently dropped one is a guest that cannot boot.
  while IFS= read -r line; do
    case $line in
      CONFIG_*=n) opt=${line%=n}; grep -q "^$opt=" "$work/.config" && { echo "guest kernel: $opt is set, the fragment wants it off" >&2; missing=1; } ;;
      CONFIG_*=*) grep -qx "$line" "$work/.config" || { echo "guest kernel: $line did not take (a dependency is missing)" >&2; missing=1; } ;;
    esac
  done < "$frag"
  [ "$missing" = 0 ] || exit 1
  make -C "$work" -s -j"$(nproc)" vmlinux
  cp "$work/vmlinux" "$work/.config" "$keep/"
}
. "$here/../buildcache.sh"
cached "${CUBICLE_KERNEL_CACHE:-/var/cache/cubicle/guest-kernel}" "$key" vmlinux build
mkdir -p "$(dirname "$out")"
cp "$cache/vmlinux" "$out.tmp" && mv "$out.tmp" "$out"
echo "guest kernel: $out ($pkg $ver, key $key)"
