#!/usr/bin/env bash
# Builds runsc from the gVisor module pinned in go.mod with its seccomp
# filters precompiled, as gVisor's Bazel build does: the Go module ships
# stubs, and a runsc built from them compiles and optimizes its Sentry's and
# gofer's filters on every sandbox start (measured from runsc's debug log:
# 20-23 ms for the Sentry's and 8 ms for the gofer's, against under 1 ms to
# load them precompiled, of the ~80 ms a `runsc run` takes on an idle
# host). precompile/ writes the two filter files; the module is
# copied, the files replaced, and runsc built against the copy through a
# go.mod `replace`. The binary is cached under a key of go.mod, go.sum,
# the generator and the Go version, so a machine builds it once (about
# 2.5 CPU-minutes) and later builds are a copy.
#
# usage: build.sh OUTPUT   (CUBICLE_RUNSC_CACHE overrides the cache dir)
set -euo pipefail
out=$(realpath -m "${1:?usage: build.sh OUTPUT}")
here=$(cd "$(dirname "$0")" && pwd)
go=${GO:-go}
export CGO_ENABLED=0 # the cgo build fails at run time (runsc re-executes itself in a chroot)
key=$( { cat "$here/go.mod" "$here/go.sum" "$here/precompile/main.go" "$0"; "$go" version; } | sha256sum | cut -c1-16)
build() {
  local work=$1 keep=$2
  cd "$here"
  local mod path version dir
  # go list -m names no Dir for a module not yet in the module cache (a
  # fresh machine): download it first.
  "$go" mod download gvisor.dev/gvisor
  mod=$("$go" list -m -f '{{.Path}} {{.Version}} {{.Dir}}' gvisor.dev/gvisor)
  read -r path version dir <<<"$mod"
  echo "runsc: precompiling seccomp filters for $path $version (key $key)"
  "$go" run ./precompile -out "$work/gen"
  cp -r "$dir" "$work/gvisor" && chmod -R u+w "$work/gvisor"
  cp "$work/gen/boot.go" "$work/gvisor/runsc/boot/filter/filter_precompiled.go"
  cp "$work/gen/fsgofer.go" "$work/gvisor/runsc/fsgofer/filter/filter_precompiled.go"
  cp go.mod go.sum "$work/"
  printf '\nreplace %s => %s\n' "$path" "$work/gvisor" >>"$work/go.mod"
  "$go" build -modfile "$work/go.mod" -trimpath -o "$keep/runsc" "$path/runsc"
}
. "$here/../buildcache.sh"
cached "${CUBICLE_RUNSC_CACHE:-/var/cache/cubicle/runsc}" "$key" runsc build
mkdir -p "$(dirname "$out")"
cp "$cache/runsc" "$out.tmp" && mv "$out.tmp" "$out"
echo "runsc: $out (precompiled seccomp filters, key $key)"
