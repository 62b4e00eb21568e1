#!/usr/bin/env bash
# LiteIO's main command: the all-in-one local mode. Installs what the build needs, builds
# every binary (with the embedded SPDK engine when SPDK is found), then runs liteio-local:
# the test API server, the node-disk-controller, a disk-agent for this machine and the CSI
# driver, each as its own process, and a demo volume created through CSI, staged, published,
# written and read. It keeps running until Ctrl-C, then cleans up and exits 0.
# Extra arguments go to liteio-local (see `target/release/liteio-local --help`), e.g. --once.
# Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '==> %s\n' "$*"; }

need=()
for p in build-essential pkg-config libclang-dev util-linux xfsprogs e2fsprogs; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ]; then
    say "installing Debian packages: ${need[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH"
if [ "$(id -u)" != 0 ]; then
    say "warning: not root: staging a volume needs loop devices and mounts; the demo will fail"
fi

features=()
export LITEIO_AGENT_SPDK=0
if [ -n "${SPDK_DIR:-}" ] || [ -e vendor/spdk ] || pkg-config --exists spdk_nvmf 2>/dev/null; then
    say "SPDK found: building the agent with the embedded SPDK engine"
    features=(--features liteio-agent/spdk)
    LITEIO_AGENT_SPDK=1
else
    say "SPDK not found: building the agent without it (the file engine serves the demo)"
fi
say "building the workspace (release; the first build takes several minutes)"
cargo build --release --locked --workspace --bins "${features[@]}"
./target/release/crdgen --check
exec ./target/release/liteio-local "$@"
