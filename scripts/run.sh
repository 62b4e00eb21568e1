#!/usr/bin/env bash
# LiteIO's main command. For now it installs what the build needs, builds every binary in
# release mode, regenerates the CRDs and checks them, and lists what was built. The
# all-in-one local mode (test API server + controller + agent + CSI + a demo volume) will
# take this place. Safe to run twice.
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

features=()
if [ -n "${SPDK_DIR:-}" ] || [ -e vendor/spdk ] || pkg-config --exists spdk_nvmf 2>/dev/null; then
    say "SPDK found: building the agent with the embedded SPDK engine"
    features=(--features liteio-agent/spdk)
else
    say "SPDK not found: building without the SPDK engine (set SPDK_DIR to enable it)"
fi
say "building the workspace (release)"
cargo build --release --locked --workspace "${features[@]}"
say "checking the CRDs in deploy/crds"
./target/release/crdgen --check
say "built:"
find target/release -maxdepth 1 -type f -executable -printf '  %p\n' | sort
