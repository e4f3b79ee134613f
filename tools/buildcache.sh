# Sourced by the tools' build scripts: a per-machine cache of build
# outputs. cached ROOT KEY FILE BUILD runs BUILD (a shell function) unless
# ROOT/KEY/FILE exists; BUILD gets a scratch dir ($1, removed afterwards)
# and leaves what is to be kept in $2, which becomes ROOT/KEY in one
# rename, so a build that fails or is cut short never leaves a half entry.
# It sets $cache to ROOT/KEY.
cached() {
  local root=$1 key=$2 file=$3 build=$4
  cache=$root/$key
  [ -e "$cache/$file" ] && return 0
  mkdir -p "$root"
  cached_work=$(mktemp -d "$root/build-XXXXXX") # global: the EXIT trap reads it
  trap 'rm -rf "$cached_work" "$cache.tmp"' EXIT
  rm -rf "$cache.tmp" && mkdir -p "$cache.tmp"
  "$build" "$cached_work" "$cache.tmp"
  rm -rf "$cache" && mv "$cache.tmp" "$cache"
}
