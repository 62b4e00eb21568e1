#!/usr/bin/env bash
# Benchmark: the agent's in-process NVMe-oF/TCP target against SPDK's stock nvmf_tgt from
# the same SPDK install, with the same configuration, driven by SPDK's spdk_nvme_perf over
# 127.0.0.1. Prints IOPS, mean and p99 latency per case and the ratio agent/stock, then the
# idle CPU of both targets in interrupt mode.
#
#   bash scripts/bench-spdk.sh            # ROUNDS=7 SECONDS_PER_RUN=5 by default
#
# Figures are medians over the rounds; the ratio is the median of the per-round ratios.
# Cases (CASES): null bdev, and aio file -> lvstore -> lvol; workloads (WORKLOADS) 4 KiB
# randread and randwrite,
# queue depth 32. Each target polls on core 0 (mask 0x1) and perf runs on core 1, both
# without hugepages. Rounds alternate which target goes first.
#
# Needs SPDK (apps and scripts/rpc.py): found through SPDK_DIR (a build tree) or pkg-config's
# spdk_nvmf prefix with its source tree at SPDK_SRC_DIR or <prefix>/share/spdk/src. Override
# the tools with NVMF_TGT, SPDK_PERF and SPDK_RPC.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-7}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
IDLE_SECONDS=${IDLE_SECONDS:-10}
NQN=nqn.2016-06.io.spdk:bench
HOST=nqn.2014-08.org.nvmexpress:uuid:6b1c7a70-3f5e-4b6e-9c1d-2a3b4c5d6e7f
PORT=${PORT:-4460}
WORK=$(mktemp -d /var/tmp/liteio-bench.XXXXXX)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$WORK"' EXIT

if [ -n "${SPDK_DIR:-}" ] && [ -d "$SPDK_DIR/build/bin" ]; then
    bin=$SPDK_DIR/build/bin src=$SPDK_DIR
    export LD_LIBRARY_PATH=$SPDK_DIR/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
    libdir=$(pkg-config --libs-only-L spdk_nvmf 2>/dev/null | awk '{sub("^-L", "", $1); print $1}')
    [ -n "$libdir" ] || { echo "SPDK not found (set SPDK_DIR or install spdk_nvmf.pc)"; exit 2; }
    prefix=$(dirname "$libdir")
    bin=$prefix/bin src=${SPDK_SRC_DIR:-$prefix/share/spdk/src}
fi
NVMF_TGT=${NVMF_TGT:-$bin/nvmf_tgt}
SPDK_PERF=${SPDK_PERF:-$bin/spdk_nvme_perf}
SPDK_RPC=${SPDK_RPC:-$src/scripts/rpc.py}
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
for t in "$NVMF_TGT" "$SPDK_PERF" "$SPDK_RPC"; do [ -e "$t" ] || { echo "missing $t"; exit 2; }; done

echo "==> building the agent's bench target (release, feature spdk)"
cargo build --release --locked -p liteio-agent --features spdk --example bench_target >/dev/null
AGENT=target/release/examples/bench_target

wait_for() { # wait_for SECONDS CMD...
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.1
    done
}

rpc() { "$PY" "$SPDK_RPC" -s "$WORK/spdk.sock" "$@" >/dev/null; }

start_agent() { # case [--interrupt]
    "$AGENT" --case "$1" --port $PORT --aio-file "$WORK/agent.img" ${2:-} >"$WORK/target.log" 2>&1 &
    TARGET_PID=$!
    wait_for 60 grep -q READY "$WORK/target.log" || { cat "$WORK/target.log"; exit 1; }
}

start_stock() { # case [--interrupt-mode]
    rm -f "$WORK/spdk.sock"
    "$NVMF_TGT" --no-huge -s 1024 -m 0x1 -u -r "$WORK/spdk.sock" ${2:-} >"$WORK/target.log" 2>&1 &
    TARGET_PID=$!
    wait_for 60 rpc spdk_get_version || { cat "$WORK/target.log"; exit 1; }
    local bdev
    if [ "$1" = null ]; then
        rpc bdev_null_create bench_null 1024 512
        bdev=bench_null
    else
        truncate -s 1G "$WORK/stock.img"
        rpc bdev_aio_create "$WORK/stock.img" bench_aio 512
        rpc bdev_wait_for_examine
        rpc bdev_lvol_get_lvstores -l bench_lvs || rpc bdev_lvol_create_lvstore -c 4194304 bench_aio bench_lvs
        rpc bdev_lvol_create -l bench_lvs bench_vol 512 || true
        bdev=bench_lvs/bench_vol
    fi
    rpc nvmf_create_transport -t TCP
    rpc nvmf_create_subsystem $NQN -s LITEIOBENCH0001 -d "LiteIO bench"
    rpc nvmf_subsystem_add_ns $NQN "$bdev"
    rpc nvmf_subsystem_add_listener $NQN -t tcp -f ipv4 -a 127.0.0.1 -s $PORT
    rpc nvmf_subsystem_add_host $NQN $HOST
}

stop_target() {
    kill -TERM "$TARGET_PID" 2>/dev/null || true
    wait "$TARGET_PID" 2>/dev/null || true
}

perf() { # workload -> "iops mean_us p99_us"
    "$SPDK_PERF" --no-huge -s 512 -c 0x2 -q 32 -o 4096 -w "$1" -t "$SECONDS_PER_RUN" -L \
        -r "trtype:tcp adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN hostnqn:$HOST" >"$WORK/perf.txt" 2>&1 || { cat "$WORK/perf.txt"; return 1; }
    awk '/^Total/ {iops=$3; mean=$5} /99\.00000%/ {gsub("us","",$3); p99=$3} END {printf "%s %s %s\n", iops, mean, p99}' "$WORK/perf.txt"
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

printf '\n%-6s %-10s %12s %12s %7s %10s %10s %10s %10s\n' case workload agent_iops stock_iops ratio agent_mean stock_mean agent_p99 stock_p99
for case in ${CASES:-null lvol}; do
    for wl in ${WORKLOADS:-randread randwrite}; do
        : >"$WORK/agent.res"; : >"$WORK/stock.res"
        for r in $(seq 1 "$ROUNDS"); do
            if [ $((r % 2)) = 1 ]; then order="agent stock"; else order="stock agent"; fi
            for who in $order; do
                "start_$who" $case
                perf $wl >>"$WORK/$who.res"
                stop_target
                printf '  # %s %s round %s %s: %s\n' $case $wl $r $who "$(tail -n1 "$WORK/$who.res")" >&2
            done
        done
        am=$(cut -d' ' -f1 "$WORK/agent.res" | median); sm=$(cut -d' ' -f1 "$WORK/stock.res" | median)
        aml=$(cut -d' ' -f2 "$WORK/agent.res" | median); sml=$(cut -d' ' -f2 "$WORK/stock.res" | median)
        ap=$(cut -d' ' -f3 "$WORK/agent.res" | median); sp=$(cut -d' ' -f3 "$WORK/stock.res" | median)
        # The ratio is the median of per-round ratios (agent and stock measured back to back in
        # each round), which cancels slow drifts of the host between rounds.
        ratio=$(paste -d' ' <(cut -d' ' -f1 "$WORK/agent.res") <(cut -d' ' -f1 "$WORK/stock.res") \
            | awk '{printf "%.6f\n", $1 / $2}' | median)
        ratio=$(printf '%.3f' "$ratio")
        printf '%-6s %-10s %12.0f %12.0f %7s %9.1fus %9.1fus %9.1fus %9.1fus\n' $case $wl "$am" "$sm" "$ratio" "$aml" "$sml" "$ap" "$sp"
    done
done

idle_cpu() { # pid -> percent of one core over IDLE_SECONDS
    local hz; hz=$(getconf CLK_TCK)
    local t0; t0=$(awk '{print $14 + $15}' "/proc/$1/stat")
    sleep "$IDLE_SECONDS"
    local t1; t1=$(awk '{print $14 + $15}' "/proc/$1/stat")
    awk -v a="$t0" -v b="$t1" -v hz="$hz" -v s="$IDLE_SECONDS" 'BEGIN {printf "%.2f", (b - a) * 100 / hz / s}'
}
echo
echo "idle CPU in interrupt mode over ${IDLE_SECONDS}s, lvol exported, no initiator (% of one core):"
start_agent lvol --interrupt
echo "  agent: $(idle_cpu "$TARGET_PID")%"
stop_target
start_stock lvol --interrupt-mode
echo "  stock nvmf_tgt: $(idle_cpu "$TARGET_PID")%"
stop_target
