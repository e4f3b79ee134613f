#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a running Cubicle with a first
# sandbox: installs what is missing, builds cubicle and runsc, starts the
# daemon — which builds the default computer (the built-in snapshot
# "default": Debian with Python, Node.js, git and a C toolchain) from
# Debian's packages on its first start, no container registry needed —
# waits for it with a progress display and runs a command in a new sandbox.
#
#   ./scripts/dev.sh            # (or: make run)
#
# Environment: CUBICLE_DATA_DIR (default /var/lib/cubicle), CUBICLE_LISTEN
# (default 127.0.0.1:8080), CUBICLE_RUNTIME (gvisor|namespace, default gvisor).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
data=${CUBICLE_DATA_DIR:-/var/lib/cubicle}
listen=${CUBICLE_LISTEN:-127.0.0.1:8080}
runtime=${CUBICLE_RUNTIME:-gvisor}

[[ $(id -u) == 0 ]] || { echo "dev.sh must run as root (sandboxes need namespaces, mounts and nftables)"; exit 1; }

echo "==> installing missing packages"
need=()
for p in busybox-static nftables iproute2 btrfs-progs debootstrap util-linux curl; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
command -v go >/dev/null || { echo "Go is required (https://go.dev/dl, or /usr/local/go/bin on PATH)"; exit 1; }

echo "==> building bin/cubicle and bin/runsc (gVisor from the Go module proxy; first build takes a few minutes)"
make build

export CUBICLE_ENDPOINT=http://$listen
if ! curl -fsS "$CUBICLE_ENDPOINT/healthz" >/dev/null 2>&1; then
  echo "==> starting the daemon (log: $data/cubicle.log)"
  mkdir -p "$data"
  nohup "$root/bin/cubicle" serve --listen "$listen" --data-dir "$data" --runtime "$runtime" >>"$data/cubicle.log" 2>&1 &
  for _ in $(seq 100); do curl -fsS "$CUBICLE_ENDPOINT/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
fi
export CUBICLE_API_KEY=${CUBICLE_API_KEY:-$(cat "$data/admin.key")}
cub=$root/bin/cubicle

echo "==> waiting for the default computer (built once by the daemon; downloads cached in ${CUBICLE_BLUEPRINT_CACHE:-$data/cache/blueprint})"
$cub snapshot wait default >/dev/null

echo "==> first sandbox"
$cub sandbox rm first >/dev/null 2>&1 || true
$cub sandbox create --name first
$cub exec first -- sh -c 'echo "hello from $(hostname) as $(id -un) in $PWD"; . /etc/os-release; echo "$PRETTY_NAME"; python --version; node --version'

cat <<MSG

Cubicle is running at $CUBICLE_ENDPOINT (runtime $runtime, data $data).
  export CUBICLE_ENDPOINT=$CUBICLE_ENDPOINT CUBICLE_API_KEY=\$(cat $data/admin.key)
  bin/cubicle exec first -- python -c 'print(6*7)'
  LANGSMITH_ENDPOINT=$CUBICLE_ENDPOINT LANGSMITH_API_KEY=\$CUBICLE_API_KEY node your-agent.mjs
MSG
