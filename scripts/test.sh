#!/usr/bin/env bash
# LiteIO's test command: installs what the checks need, then runs the format check, clippy
# with -D warnings, and every test tier, and prints one summary line per tier.
#
#   T0  unit tests (lib and bin targets, tests/t0_*.rs): always
#   T1  components against the test API server and the file engine (tests/t1_*.rs): always;
#       the PostgreSQL MetaSync tests use a private PostgreSQL started here (see pg_start)
#   T2  against a real kube-apiserver (tests/t2_*.rs): when LITEIO_TEST_KUBECONFIG is set
#   T3  against real SPDK (agent feature `spdk`, liteio-spdk feature `link`, t3_*.rs): when SPDK is found
#       (SPDK_DIR, vendor/spdk, or pkg-config's spdk_nvmf)
#   T4  Debian's stock kernels in microVMs (tests/t4_*.rs): when QEMU, virtme-ng and the
#       kernels are installed (installed here when root on Debian; LITEIO_TEST_T4=0 skips)
#
# Safe to run twice. Exit status is non-zero when a check or a test failed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export CARGO_TERM_COLOR=never
# A cold build of every tier needs about 15 GiB; incremental caches would add several more
# and buy nothing in a one-shot run.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
log_dir=${LITEIO_TEST_LOG_DIR:-$root/target/test-logs}
mkdir -p "$log_dir"

say() { printf '==> %s\n' "$*"; }

# A full disk shows up as a link error far from its cause: say it first.
free_kib=$(df -Pk "$root" 2>/dev/null | awk 'NR == 2 { print $4 }')
if [ -n "$free_kib" ] && [ "$free_kib" -lt $((20 * 1024 * 1024)) ]; then
    say "warning: only $((free_kib / 1024 / 1024)) GiB free under $root; a cold build of all tiers needs about 15 GiB"
fi

# --- what the checks need -------------------------------------------------------------
# prometheus: its promtool checks every component's /metrics and the alerting rules.
need_pkgs=()
for p in build-essential pkg-config libclang-dev clang util-linux xfsprogs e2fsprogs jq python3 postgresql prometheus; do
    dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "installing Debian packages: ${need_pkgs[*]}"
        # prometheus without its recommends (node exporter, smartmontools, nvme-cli: services
        # and tools that would change what the tests find on this machine); promtool is all
        # the tests use, so a server the package started is stopped again.
        other=()
        for p in "${need_pkgs[@]}"; do [ "$p" = prometheus ] || other+=("$p"); done
        apt-get update -qq >/dev/null \
            && { [ ${#other[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${other[@]}" >/dev/null; } \
            && { dpkg -s prometheus >/dev/null 2>&1 \
                || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
            || say "warning: could not install ${need_pkgs[*]}"
        if [[ " ${need_pkgs[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null \
            && systemctl is-active --quiet prometheus 2>/dev/null; then
            systemctl disable --now prometheus >/dev/null 2>&1 && say "stopped the prometheus service the package started (the tests use promtool only)"
        fi
    else
        say "warning: missing Debian packages (run as root to install): ${need_pkgs[*]}"
    fi
fi
if ! command -v cargo >/dev/null; then
    [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null; then
    say "cargo not found: install a Rust toolchain (1.89 or newer) with rustfmt and clippy"
    exit 1
fi
for comp in rustfmt clippy; do
    if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1 && command -v rustup >/dev/null; then
        rustup component add "$comp" >/dev/null 2>&1 || true
    fi
done

# --- what tier 4 needs: QEMU, Debian 12's kernels (6.12 from bookworm-backports, 6.1 from
# bookworm), virtme-ng (PyPI), and the host tools the guests run from the host's root -----
t4_install() {
    [ "${LITEIO_TEST_T4:-1}" != 0 ] || return 0
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 0
    grep -qs 'bookworm' /etc/os-release || return 0
    if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
            >/etc/apt/sources.list.d/liteio-backports.sources
        apt-get update -qq >/dev/null 2>&1
    fi
    local need=()
    for p in busybox-static nvme-cli lvm2 fio socat; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
    ls /boot/vmlinuz-6.12.*-amd64 >/dev/null 2>&1 || need+=(linux-image-amd64)
    dpkg -s qemu-system-x86 >/dev/null 2>&1 || need+=(qemu-system-x86)
    if [ ${#need[@]} -gt 0 ]; then
        say "installing for T4 (bookworm-backports): ${need[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports "${need[@]}" >/dev/null 2>&1 \
            || say "warning: could not install ${need[*]}"
    fi
    if ! ls /boot/vmlinuz-6.1.*-amd64 >/dev/null 2>&1; then
        local v k
        # The newest 6.1 (bookworm or bookworm-security).
        v=$(apt-cache madison linux-image-amd64 2>/dev/null | awk -F' *[|] *' '$2 ~ /^6[.]1[.]/ { print $2 }' | sort -V | tail -n 1)
        k=$(apt-cache depends "linux-image-amd64=$v" 2>/dev/null | awk '/Depends: linux-image-6/ { print $2; exit }')
        if [ -n "$k" ]; then
            say "installing for T4: $k (Debian 12's stock kernel)"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$k" >/dev/null 2>&1 || say "warning: could not install $k"
        fi
    fi
    if ! command -v vng >/dev/null; then
        say "installing for T4: virtme-ng (PyPI)"
        python3 -m pip install -q virtme-ng >/dev/null 2>&1 || say "warning: could not install virtme-ng"
        command -v pyenv >/dev/null && pyenv rehash
        hash -r
    fi
}
# Why no VM can boot here, or nothing.
t4_unavailable() {
    [ "${LITEIO_TEST_T4:-1}" != 0 ] || { echo "LITEIO_TEST_T4=0"; return; }
    [ "$(id -u)" = 0 ] || { echo "not root (taps, loop devices)"; return; }
    command -v vng >/dev/null || { echo "no vng (virtme-ng from PyPI)"; return; }
    command -v qemu-system-x86_64 >/dev/null || { echo "no qemu-system-x86_64 (Debian qemu-system-x86)"; return; }
    command -v busybox >/dev/null || { echo "no busybox (Debian busybox-static)"; return; }
    ls /boot/vmlinuz-6.12.*-amd64 >/dev/null 2>&1 || { echo "no 6.12 kernel (linux-image-amd64 from bookworm-backports)"; return; }
}
t4_install

spdk_found() {
    [ -n "${SPDK_DIR:-}" ] && return 0
    [ -e "$root/vendor/spdk" ] && return 0
    pkg-config --exists spdk_nvmf 2>/dev/null
}

# --- static checks --------------------------------------------------------------------
failed_checks=0
say "cargo fmt --check"
cargo fmt --all -- --check || { say "FAILED: formatting (run cargo fmt --all)"; failed_checks=$((failed_checks + 1)); }
say "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings 2>&1 | tail -n 60
[ "${PIPESTATUS[0]}" = 0 ] || { say "FAILED: clippy"; failed_checks=$((failed_checks + 1)); }
if spdk_found; then
    say "cargo clippy (agent and cluster tests with spdk) -D warnings"
    cargo clippy -p liteio-agent -p liteio-cluster-tests --features liteio-agent/spdk,liteio-cluster-tests/spdk \
        --all-targets --locked -- -D warnings 2>&1 | tail -n 60
    [ "${PIPESTATUS[0]}" = 0 ] || { say "FAILED: clippy (spdk)"; failed_checks=$((failed_checks + 1)); }
fi

# --- PostgreSQL for the MetaSync tests ------------------------------------------------
# A LITEIO_TEST_POSTGRES_URL given by the caller is used when a server answers there.
# Otherwise a private cluster is started: initdb into $pg_dir (trust authentication,
# listening on 127.0.0.1 only, on a free port, fsync off), run as the postgres OS user when
# we are root (the server refuses to run as root), with the database liteio_test. A server
# left by an earlier run is stopped and the cluster reused; it is stopped when this script
# exits. When none can be had, one line says why and the PostgreSQL tests print
# "SKIP …: <why>" (from LITEIO_TEST_POSTGRES_SKIP) and count as skipped.
pg_dir=${LITEIO_TEST_PG_DIR:-$root/target/pg}
pg_bin="" pg_started="" pg_tmp=""
pg_as() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
pg_skip() {
    export LITEIO_TEST_POSTGRES_SKIP="$*"
    unset LITEIO_TEST_POSTGRES_URL
    say "PostgreSQL not started, its tests will be skipped: $*"
}
pg_stop() {
    [ -n "$pg_started" ] || return 0
    pg_as "$pg_bin/pg_ctl" -D "$pg_dir/data" -m fast -w -t 60 stop >/dev/null 2>&1 || true
    pg_started=""
    [ -z "$pg_tmp" ] || rm -rf "$pg_tmp"
}
pg_start() {
    pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -n "${LITEIO_TEST_POSTGRES_URL:-}" ]; then
        if [ -n "$pg_bin" ] && "$pg_bin/pg_isready" -q -t 5 -d "$LITEIO_TEST_POSTGRES_URL"; then
            say "PostgreSQL: using LITEIO_TEST_POSTGRES_URL from the environment"
            return
        fi
        say "PostgreSQL: no server answers at LITEIO_TEST_POSTGRES_URL; starting a private one"
        unset LITEIO_TEST_POSTGRES_URL
    fi
    if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ] || [ ! -x "$pg_bin/pg_ctl" ]; then
        pg_skip "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin (Debian package postgresql)"
        return
    fi
    if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
        pg_skip "running as root and there is no postgres user to run the server as"
        return
    fi
    mkdir -p "$pg_dir" 2>/dev/null
    [ "$(id -u)" = 0 ] && chown postgres: "$pg_dir" 2>/dev/null
    if ! pg_as test -w "$pg_dir" -a -x "$pg_dir"; then
        # The postgres user cannot reach the work tree: use a directory it can.
        pg_dir=$(mktemp -d /tmp/liteio-pg.XXXXXX) || { pg_skip "cannot make a data directory"; return; }
        pg_tmp=$pg_dir
        [ "$(id -u)" = 0 ] && chown postgres: "$pg_dir"
    fi
    if [ -f "$pg_dir/data/postmaster.pid" ]; then
        pg_as "$pg_bin/pg_ctl" -D "$pg_dir/data" -m fast -w -t 60 stop >/dev/null 2>&1 || true
    fi
    if [ ! -f "$pg_dir/data/PG_VERSION" ] || [ "$(cat "$pg_dir/data/PG_VERSION")" != "$(basename "$(dirname "$pg_bin")")" ]; then
        rm -rf "$pg_dir/data"
        if ! pg_as "$pg_bin/initdb" -D "$pg_dir/data" -A trust -U postgres -E UTF8 --no-sync \
            >"$pg_dir/initdb.log" 2>&1; then
            pg_skip "initdb failed (see $pg_dir/initdb.log)"
            return
        fi
    fi
    local port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])') \
        || { pg_skip "cannot find a free TCP port"; return; }
    if ! pg_as "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k '$pg_dir' -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
        start >/dev/null 2>&1; then
        pg_skip "the server did not start (see $pg_dir/server.log)"
        return
    fi
    pg_started=1
    if ! pg_as "$pg_bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qtAc \
        "SELECT 1 FROM pg_database WHERE datname = 'liteio_test'" 2>/dev/null | grep -q 1 \
        && ! pg_as "$pg_bin/createdb" -h 127.0.0.1 -p "$port" -U postgres liteio_test >/dev/null 2>&1; then
        pg_stop
        pg_skip "cannot create the database liteio_test"
        return
    fi
    export LITEIO_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/liteio_test"
    say "PostgreSQL $(basename "$(dirname "$pg_bin")") at $LITEIO_TEST_POSTGRES_URL (data in $pg_dir/data)"
}
trap pg_stop EXIT
pg_start

# --- tiers ----------------------------------------------------------------------------
# Names of integration-test targets that start with a prefix, across the workspace.
targets_with_prefix() {
    cargo metadata --no-deps --format-version 1 --locked 2>/dev/null \
        | jq -r --arg p "$1" '.packages[].targets[] | select(.kind == ["test"]) | select(.name | startswith($p)) | .name'
}

# run_tier / skip_tier and the accounting rules (what makes a tier fail) are in lib/tier.sh.
source "$root/scripts/lib/tier.sh"

t0_args=(--workspace --lib --bins)
[ -n "$(targets_with_prefix t0_)" ] && t0_args+=(--test 't0_*')
run_tier T0 "unit" -- "${t0_args[@]}" -- --show-output

if [ -n "$(targets_with_prefix t1_)" ]; then
    run_tier T1 "test API server, file engine" -- --workspace --test 't1_*' -- --show-output
else
    skip_tier T1 "no T1 tests in the workspace yet"
fi

if [ -z "${LITEIO_TEST_KUBECONFIG:-}" ]; then
    skip_tier T2 "LITEIO_TEST_KUBECONFIG not set: no real kube-apiserver"
elif [ -z "$(targets_with_prefix t2_)" ]; then
    skip_tier T2 "no T2 tests in the workspace yet"
else
    run_tier T2 "real kube-apiserver at $LITEIO_TEST_KUBECONFIG" -- --workspace --test 't2_*' -- --test-threads=1 --show-output
fi

if ! spdk_found; then
    skip_tier T3 "SPDK not found (set SPDK_DIR, place it at vendor/spdk, or install spdk_nvmf.pc for pkg-config)"
else
    # The agent's T3 tests, the safe SPDK crate's own (spdk/tests/t3_*.rs) and the
    # whole-cluster ones (tests/cluster/tests/t3_*.rs, which run the binaries of the T1 build
    # and the disk-agent built here with SPDK).
    t3_args=(-p liteio-agent -p liteio-spdk -p liteio-cluster-tests
        --features liteio-agent/spdk,liteio-spdk/link,liteio-cluster-tests/spdk)
    [ -n "$(targets_with_prefix t3_)" ] && t3_args+=(--test 't3_*')
    run_tier T3 "real SPDK" -- "${t3_args[@]}" -- --test-threads=1 --show-output
fi

t4_why=$(t4_unavailable)
if [ -n "$t4_why" ]; then
    skip_tier T4 "no microVMs: $t4_why"
elif [ -z "$(targets_with_prefix t4_)" ]; then
    skip_tier T4 "no T4 tests in the workspace yet"
else
    # With SPDK, the agent's T4 tests against its embedded target run too.
    t4_args=(--workspace --test 't4_*')
    spdk_found && t4_args+=(--features liteio-agent/spdk,liteio-cluster-tests/spdk)
    run_tier T4 "Debian kernels in microVMs" -- "${t4_args[@]}" -- --test-threads=1 --show-output
fi

echo
echo "LiteIO test summary"
for line in "${summary[@]}"; do echo "$line"; done
[ "$failed_checks" = 0 ] || echo "static checks: $failed_checks failed (fmt/clippy)"
echo "total: $total_pass passed, $((total_fail + failed_checks)) failed, $total_skip skipped"
[ "$total_fail" = 0 ] && [ "$failed_checks" = 0 ]
