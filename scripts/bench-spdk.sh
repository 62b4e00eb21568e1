#!/usr/bin/env bash
# Benchmark of LiteIO's SPDK data path over NVMe-oF/TCP on 127.0.0.1, driven by SPDK's
# spdk_nvme_perf (4 KiB, queue depth 32), in three cases (CASES, default "null lvol prod"):
#
#   null  the agent's in-process target (agent/examples/bench_target.rs) against SPDK's stock
#         nvmf_tgt from the same install, exporting a null bdev: the cost of the embedding.
#   lvol  the same two targets exporting a 512 MiB lvol of an lvstore on a 1 GiB aio file.
#         The lvol is filled through the target with one sequential 128 KiB write pass before
#         it is measured (SPDK unmaps an lvol's clusters when it creates it, which punches
#         holes in the aio file, and reads of holes cost the file system nothing); the
#         script prints the file's allocated bytes (st_blocks) against its apparent size
#         and checks that the lvol's whole extent is written. Beside each lvol figure it
#         prints the same workload run natively on that file by fio with the engine SPDK's
#         aio bdev uses (ioengine=libaio, direct=1, iodepth=32, 4 KiB, one job pinned to the
#         targets' core), on the lvol's own 512 MiB extent, and the ratio lvol/native.
#   prod  the production binaries as `liteio-local` runs them (test API server, controller,
#         disk-agent with its SPDK engine, CSI driver; pool = a 1 GiB aio file): the volume
#         that liteio-local provisions through the CSI controller (an AntstorVolume, as for a
#         PVC) is found through the API (address, port and subsystem NQN from its
#         spec.spdkTarget, the allowed host NQN from its host node's StoragePool), filled,
#         and driven with spdk_nvme_perf, once while the agent's /metrics is scraped every
#         second and once without; compared with stock nvmf_tgt exporting a filled 512 MiB
#         lvol on a 1 GiB aio file in the same file system. PROD_MODE=poll (default) runs
#         both targets' reactors polling (`liteio-local --spdk-polling`, as production
#         nodes do); PROD_MODE=interrupt runs both in interrupt mode (liteio-local's default,
#         stock with --interrupt-mode).
#
# Then the idle CPU of both targets in interrupt mode (IDLE_SECONDS, 0 skips it).
#
#   bash scripts/bench-spdk.sh                 # ROUNDS=7 SECONDS_PER_RUN=5
#   ROUNDS=3 CASES="lvol prod" bash scripts/bench-spdk.sh
#   bash scripts/bench-spdk.sh --help
#
# Every figure is a median over ROUNDS rounds; a ratio is the median of the per-round ratios
# (both sides measured back to back in each round, which cancels slow drifts of the host),
# printed with the worst (lowest) round's ratio. Rounds alternate which side goes first.
# Placement: each target's reactor on core 0 (mask 0x1), spdk_nvme_perf on core 1 (mask 0x2),
# native fio pinned to core 0 (NATIVE_CORE); all without hugepages. The prod case's other
# processes (API server, controller, CSI driver, the agent's tokio threads, curl) are not
# pinned. So the SPDK figures use two cores (target + initiator), native fio one. The tables
# show the share of a core each target process and spdk_nvme_perf received during the runs: on
# a machine shared with other work a polling reactor gets less than its core (below 100 %),
# while fio sleeps while it waits and loses little.
#
# Environment: ROUNDS, SECONDS_PER_RUN, IDLE_SECONDS, CASES, WORKLOADS ("randread randwrite"),
# PORT (stock and bench_target listener, 4460), METRICS_PORT (the prod agent's /metrics,
# 19469), PROD_MODE, NATIVE_CORE (0). SPDK (apps and scripts/rpc.py) is found through SPDK_DIR
# (a build tree) or pkg-config's spdk_nvmf prefix with its source tree at SPDK_SRC_DIR or
# <prefix>/share/spdk/src; override the tools with NVMF_TGT, SPDK_PERF and SPDK_RPC. The lvol
# case needs fio, the prod case kubectl and jq (and curl for the scrape).
#
# io_uring: the SPDK under /opt/spdk here is built without --with-uring (no uring bdev module
# in its lib/, liburing only as a system package), so the uring bdev cannot be compared; the
# aio bdev and fio's libaio are what this script measures.
set -euo pipefail
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit 0
fi
[ $# = 0 ] || { echo "bench-spdk.sh takes no arguments (see --help); got: $*" >&2; exit 2; }
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-7}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
IDLE_SECONDS=${IDLE_SECONDS:-10}
CASES=${CASES:-null lvol prod}
# spdk_nvme_perf's DH-HMAC-CHAP options: set for the prod case, whose export requires them.
PERF_AUTH=()
WORKLOADS=${WORKLOADS:-randread randwrite}
PROD_MODE=${PROD_MODE:-poll}
NATIVE_CORE=${NATIVE_CORE:-0}
NQN=nqn.2016-06.io.spdk:bench
HOST=nqn.2014-08.org.nvmexpress:uuid:6b1c7a70-3f5e-4b6e-9c1d-2a3b4c5d6e7f
PORT=${PORT:-4460}
METRICS_PORT=${METRICS_PORT:-19469}
BACKING_MIB=1024 LVOL_MIB=512
LVOL_BYTES=$((LVOL_MIB << 20))
case "$PROD_MODE" in poll | interrupt) ;; *) echo "PROD_MODE must be poll or interrupt, not $PROD_MODE" >&2; exit 2 ;; esac

TARGET_PID='' LOCAL_PID='' SCRAPE_PID=''
WORK=$(mktemp -d /var/tmp/liteio-bench.XXXXXX)
cleanup() {
    # Only what this script started, by process id; liteio-local stops its components itself.
    for p in $SCRAPE_PID $TARGET_PID $LOCAL_PID; do kill -TERM "$p" 2>/dev/null || true; done
    for p in $SCRAPE_PID $TARGET_PID $LOCAL_PID; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -n "${SPDK_DIR:-}" ] && [ -d "$SPDK_DIR/build/bin" ]; then
    bin=$SPDK_DIR/build/bin src=$SPDK_DIR
    export LD_LIBRARY_PATH=$SPDK_DIR/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
    libdir=$(pkg-config --libs-only-L spdk_nvmf 2>/dev/null | awk '{sub("^-L", "", $1); print $1}')
    [ -n "$libdir" ] || { echo "SPDK not found (set SPDK_DIR or install spdk_nvmf.pc)" >&2; exit 2; }
    prefix=$(dirname "$libdir")
    bin=$prefix/bin src=${SPDK_SRC_DIR:-$prefix/share/spdk/src}
    # The apps link SPDK's shared libraries, which need not be on the loader's path.
    export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
NVMF_TGT=${NVMF_TGT:-$bin/nvmf_tgt}
SPDK_PERF=${SPDK_PERF:-$bin/spdk_nvme_perf}
SPDK_RPC=${SPDK_RPC:-$src/scripts/rpc.py}
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
# GNU time, when installed, reports the CPU share spdk_nvme_perf received.
TIME=''; [ -x /usr/bin/time ] && TIME="/usr/bin/time -f %P -o $WORK/perf.cpu"
for t in "$NVMF_TGT" "$SPDK_PERF" "$SPDK_RPC"; do [ -e "$t" ] || { echo "missing $t (SPDK app or rpc.py)" >&2; exit 2; }; done
need() { command -v "$1" >/dev/null || { echo "the $2 case needs $1, which is not installed (or drop it from CASES)" >&2; exit 2; }; }
case " $CASES " in *" lvol "*) need fio lvol; need taskset lvol ;; esac
case " $CASES " in *" prod "*) need kubectl prod; need jq prod; need curl prod ;; esac
for c in $CASES; do case $c in null | lvol | prod) ;; *) echo "unknown case $c (null, lvol, prod)" >&2; exit 2 ;; esac; done

echo "==> building the agent's bench target and the production binaries (release, SPDK)"
# The same build as scripts/run.sh, so that the binaries are the ones it runs.
cargo build --release --locked --workspace --bins --features liteio-agent/spdk >/dev/null
cargo build --release --locked -p liteio-agent --features spdk --example bench_target >/dev/null
AGENT=target/release/examples/bench_target
LOCAL=target/release/liteio-local
echo "==> load average at start: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"

wait_for() { # wait_for SECONDS CMD...
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.1
    done
}

rpc() { "$PY" "$SPDK_RPC" -s "$WORK/spdk.sock" "$@" >/dev/null; }

note() { printf '  # %s\n' "$*" >&2; }

# --- targets: the bench example and stock nvmf_tgt ---------------------------------------

start_agent() { # case [--interrupt]
    : >"$WORK/target.log" # not the READY of the previous target
    "$AGENT" --case "$1" --port "$PORT" --aio-file "$WORK/agent.img" --size-mib $BACKING_MIB ${2:-} >"$WORK/target.log" 2>&1 &
    TARGET_PID=$! CPU_PID=$!
    wait_for 60 grep -q READY "$WORK/target.log" || { cat "$WORK/target.log"; exit 1; }
    BACKING=$WORK/agent.img TR="trtype:tcp adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN hostnqn:$HOST"
}

start_stock() { # case [--interrupt-mode] [image]
    local img=${3:-$WORK/stock.img}
    rm -f "$WORK/spdk.sock"
    : >"$WORK/target.log"
    "$NVMF_TGT" --no-huge -s 1024 -m 0x1 -u -r "$WORK/spdk.sock" ${2:-} >"$WORK/target.log" 2>&1 &
    TARGET_PID=$! CPU_PID=$!
    wait_for 60 rpc spdk_get_version || { cat "$WORK/target.log"; exit 1; }
    local bdev
    if [ "$1" = null ]; then
        rpc bdev_null_create bench_null 1024 512
        bdev=bench_null
    else
        truncate -s ${BACKING_MIB}M "$img"
        rpc bdev_aio_create "$img" bench_aio 512
        rpc bdev_wait_for_examine
        rpc bdev_lvol_get_lvstores -l bench_lvs || rpc bdev_lvol_create_lvstore -c 4194304 bench_aio bench_lvs
        rpc bdev_lvol_create -l bench_lvs bench_vol $LVOL_MIB || true
        bdev=bench_lvs/bench_vol
    fi
    rpc nvmf_create_transport -t TCP
    rpc nvmf_create_subsystem $NQN -s LITEIOBENCH0001 -d "LiteIO bench"
    rpc nvmf_subsystem_add_ns $NQN "$bdev"
    rpc nvmf_subsystem_add_listener $NQN -t tcp -f ipv4 -a 127.0.0.1 -s "$PORT"
    rpc nvmf_subsystem_add_host $NQN $HOST
    BACKING=$img TR="trtype:tcp adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN hostnqn:$HOST"
}

stop_target() {
    kill -TERM "$TARGET_PID" 2>/dev/null || true
    wait "$TARGET_PID" 2>/dev/null || true
    TARGET_PID=''
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# perf WORKLOAD -> "iops mean_us p99_us target_cpu perf_cpu", against $TR. The CPU figures are
# the % of one core that the target process ($CPU_PID) and spdk_nvme_perf received during the
# run: a polling reactor that has its core to itself shows 100.
perf() {
    local c0 c1 w0 w1 pc=-
    c0=$(cpu_ticks "$CPU_PID") w0=$(date +%s%N)
    $TIME "$SPDK_PERF" --no-huge -s 512 -c 0x2 -q 32 -o 4096 -w "$1" -t "$SECONDS_PER_RUN" -L -r "$TR" \
        "${PERF_AUTH[@]}" >"$WORK/perf.txt" 2>&1 || { cat "$WORK/perf.txt"; return 1; }
    c1=$(cpu_ticks "$CPU_PID") w1=$(date +%s%N)
    [ -n "$TIME" ] && pc=$(tr -d '%' <"$WORK/perf.cpu")
    grep -q '^Total' "$WORK/perf.txt" || { echo "spdk_nvme_perf $1 printed no result against $TR:" >&2; cat "$WORK/perf.txt" >&2; return 1; }
    awk -v c="$((c1 - c0))" -v w="$((w1 - w0))" -v hz="$(getconf CLK_TCK)" -v pc="$pc" \
        '/^Total/ {iops=$3; mean=$5} /99\.00000%/ {gsub("us","",$3); p99=$3}
         END {printf "%s %s %s %.0f %s\n", iops, mean, p99, c / hz * 1e11 / w, pc}' "$WORK/perf.txt"
}

# --- the backing file: allocated blocks, filling ------------------------------------------

# extent FILE -> "allocated_bytes apparent_bytes start length": st_blocks and the size, and the
# longest run of written data (SEEK_DATA/SEEK_HOLE).
extent() {
    "$PY" - "$1" <<'EOF'
import os, sys
path = sys.argv[1]
st = os.stat(path)
fd = os.open(path, os.O_RDONLY)
best, off = (0, 0), 0
while off < st.st_size:
    try:
        data = os.lseek(fd, off, os.SEEK_DATA)
    except OSError:  # ENXIO: no data after off
        break
    hole = os.lseek(fd, data, os.SEEK_HOLE)
    if hole - data > best[1]:
        best = (data, hole - data)
    off = hole
print(st.st_blocks * 512, st.st_size, best[0], best[1])
EOF
}

# The lvol's extent in its backing file once filled: the end of the longest written run, as
# the lvstore's metadata precedes its first (thick, contiguous) lvol. Fills the lvol through
# the target ($TR) with one sequential 128 KiB write pass when that run is shorter than the
# lvol, then checks again. Sets NATIVE_OFFSET; prints what it found.
ensure_filled() { # label
    local alloc size start len
    read -r alloc size start len < <(extent "$BACKING")
    if [ "$len" -lt $LVOL_BYTES ]; then
        note "$1: backing $(basename "$BACKING") has $alloc of $size bytes allocated; filling the $LVOL_BYTES-byte volume through the target"
        "$SPDK_PERF" --no-huge -s 512 -c 0x2 -q 8 -o 131072 -w write -t 300 -d $((LVOL_BYTES / 131072)) -r "$TR" \
            "${PERF_AUTH[@]}" >"$WORK/fill.txt" 2>&1 || { cat "$WORK/fill.txt"; exit 1; }
        read -r alloc size start len < <(extent "$BACKING")
        [ "$len" -ge $LVOL_BYTES ] || { echo "$1: after the fill pass $(basename "$BACKING") has no written run of $LVOL_BYTES bytes (longest $len)" >&2; exit 1; }
    fi
    NATIVE_OFFSET=$((start + len - LVOL_BYTES))
    printf '%s: backing %s allocated %s of %s bytes (%.1f%%); written run %s bytes at %s covers the %s-byte lvol\n' \
        "$1" "$(basename "$BACKING")" "$alloc" "$size" "$(awk -v a="$alloc" -v s="$size" 'BEGIN {print a * 100 / s}')" \
        "$len" "$start" $LVOL_BYTES >>"$WORK/backing.txt"
}

native() { # file offset workload -> "iops mean_us p99_us": fio, the same workload on the same extent
    taskset -c "$NATIVE_CORE" fio --name=native --filename="$1" --offset="$2" --size=$LVOL_BYTES \
        --ioengine=libaio --direct=1 --iodepth=32 --bs=4k --rw="$3" --numjobs=1 \
        --time_based --runtime="$SECONDS_PER_RUN" --randrepeat=0 --norandommap \
        --output-format=json >"$WORK/fio.json" 2>"$WORK/fio.err" || { cat "$WORK/fio.err" "$WORK/fio.json"; return 1; }
    local dir=read; [ "$3" = randwrite ] && dir=write
    jq -r --arg d $dir '.jobs[0] | "\(.[$d].iops) \(.[$d].lat_ns.mean / 1000) \(.[$d].clat_ns.percentile["99.000000"] / 1000) \(.usr_cpu + .sys_cpu | round)"' "$WORK/fio.json"
}

# --- figures -------------------------------------------------------------------------------

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
col() { cut -d' ' -f"$2" "$WORK/$1.res" | median; } # res-name column -> median
# ratio A B -> "median worst" of the per-round ratios of column 1
ratio() {
    paste -d' ' <(cut -d' ' -f1 "$WORK/$1.res") <(cut -d' ' -f1 "$WORK/$2.res") \
        | awk '{printf "%.6f\n", $1 / $2}' >"$WORK/ratios"
    printf '%.3f %.3f' "$(median <"$WORK/ratios")" "$(sort -g "$WORK/ratios" | head -n1)"
}
round_order() { if [ $(($1 % 2)) = 1 ]; then echo "$2 $3"; else echo "$3 $2"; fi; }

TABLE1=$WORK/table1 TABLE2=$WORK/table2 TABLE3=$WORK/table3
: >"$TABLE1"; : >"$TABLE2"; : >"$TABLE3"; : >"$WORK/backing.txt"

# --- null and lvol: bench_target against stock, lvol against native -----------------------

for case in $CASES; do
    [ "$case" = prod ] && continue
    for wl in $WORKLOADS; do
        for f in agent stock nagent nstock; do : >"$WORK/$f.res"; done
        for r in $(seq 1 "$ROUNDS"); do
            for who in $(round_order "$r" agent stock); do
                "start_$who" "$case"
                [ "$case" = lvol ] && ensure_filled "lvol $who $wl round $r"
                perf "$wl" >>"$WORK/$who.res"
                stop_target
                note "$case $wl round $r $who: $(tail -n1 "$WORK/$who.res")"
                if [ "$case" = lvol ]; then
                    native "$BACKING" "$NATIVE_OFFSET" "$wl" >>"$WORK/n$who.res"
                    note "$case $wl round $r native fio on $(basename "$BACKING"): $(tail -n1 "$WORK/n$who.res")"
                fi
            done
        done
        printf '%-6s %-10s %12.0f %12.0f %7s %6s %9.1fus %9.1fus %9.1fus %9.1fus %5s%% %5s%% %5s%%\n' "$case" "$wl" \
            "$(col agent 1)" "$(col stock 1)" $(ratio agent stock) \
            "$(col agent 2)" "$(col stock 2)" "$(col agent 3)" "$(col stock 3)" \
            "$(col agent 4)" "$(col stock 4)" "$(col agent 5)" >>"$TABLE1"
        if [ "$case" = lvol ]; then
            printf '%-10s %11.0f %11.0f %7s %6s %11.0f %11.0f %7s %6s %9.1fus %9.1fus %5s%%\n' "$wl" \
                "$(col agent 1)" "$(col nagent 1)" $(ratio agent nagent) \
                "$(col stock 1)" "$(col nstock 1)" $(ratio stock nstock) \
                "$(col nagent 2)" "$(col nagent 3)" "$(col nagent 4)" >>"$TABLE2"
        fi
    done
done

# --- prod: the production binaries through liteio-local -----------------------------------

LDIR=$WORK/local
kc() { kubectl --kubeconfig "$LDIR/kubeconfig" -n obnvmf "$@"; }

start_local() {
    local flags=(--dir "$LDIR" --engine spdk --pool-size-gib 1 --agent-metrics-addr "127.0.0.1:$METRICS_PORT")
    [ "$PROD_MODE" = poll ] && flags+=(--spdk-polling)
    : >"$WORK/local.log" # not the readiness line of the previous run
    "$LOCAL" "${flags[@]}" >"$WORK/local.log" 2>&1 &
    LOCAL_PID=$!
    # liteio-local provisions its demo volume through the CSI controller, checks its data path
    # with nvmf-check and then keeps everything running until SIGTERM.
    local deadline=$((SECONDS + 300))
    until grep -q 'LiteIO is running' "$WORK/local.log"; do
        kill -0 "$LOCAL_PID" 2>/dev/null || { echo "liteio-local exited before it was ready:" >&2; cat "$WORK/local.log" >&2; exit 1; }
        [ $SECONDS -lt $deadline ] || { echo "liteio-local was not ready after 300 s:" >&2; cat "$WORK/local.log" >&2; exit 1; }
        sleep 0.5
    done
    local vol host pool
    vol=$(kc get antstorvolumes -o json | jq -c '[.items[] | select(.status.status == "ready")][0]')
    [ "$vol" != null ] || { echo "no ready AntstorVolume in liteio-local's cluster" >&2; kc get antstorvolumes -o yaml >&2; exit 1; }
    host=$(jq -r '.spec.hostNode.id' <<<"$vol")
    pool=$(kc get storagepool "$host" -o json)
    PROD_HOST=$(jq -r '.metadata.annotations["obnvmf/hostnqn"] // empty' <<<"$pool")
    [ -n "$PROD_HOST" ] || { echo "StoragePool $host has no obnvmf/hostnqn annotation" >&2; exit 1; }
    PROD_SIZE=$(jq -r '.spec.sizeByte' <<<"$vol")
    [ "$PROD_SIZE" = $LVOL_BYTES ] || note "prod: the volume has $PROD_SIZE bytes, the stock lvol $LVOL_BYTES"
    TR=$(jq -r --arg h "$PROD_HOST" '.spec.spdkTarget | "trtype:tcp adrfam:IPv4 traddr:\(.address) trsvcid:\(.svcID) subnqn:\(.subsysNqn) hostnqn:\($h)"' <<<"$vol")
    case "$TR" in *"traddr:127."*) ;; *) echo "the volume's export is not on 127.0.0.0/8: $TR" >&2; exit 1 ;; esac
    # The export requires the volume's DH-HMAC-CHAP keys (the agent's default nvmf.auth:
    # dhchap): spdk_nvme_perf reads them from 0600 files, as its keyring wants them.
    local secret
    secret=liteio-auth-$(jq -r '.metadata.annotations["obnvmf/csi-name"] // .metadata.labels["obnvmf/pv-name"] // .metadata.name' <<<"$vol")
    mkdir -p "$WORK/keys" && chmod 700 "$WORK/keys"
    (
        umask 077
        kc get secret "$secret" -o json | jq -r '.data.dhchapKey' | base64 -d >"$WORK/keys/host"
        kc get secret "$secret" -o json | jq -r '.data.dhchapCtrlKey' | base64 -d >"$WORK/keys/ctrl"
    ) || { echo "cannot read the volume's keys from Secret $secret" >&2; exit 1; }
    grep -q '^DHHC-1:' "$WORK/keys/host" || { echo "Secret $secret holds no DH-HMAC-CHAP key" >&2; exit 1; }
    PERF_AUTH=(--dhchap-key "$WORK/keys/host" --dhchap-ctrlr-key "$WORK/keys/ctrl")
    BACKING=$LDIR/pool/aio-lvs.img
    CPU_PID=$(pgrep -P "$LOCAL_PID" -x disk-agent) || { echo "no disk-agent child of liteio-local ($LOCAL_PID)" >&2; exit 1; }
    note "prod: volume $(jq -r .metadata.name <<<"$vol") exported at $TR"
}

stop_local() {
    kill -TERM "$LOCAL_PID" 2>/dev/null || true
    wait "$LOCAL_PID" 2>/dev/null || true
    LOCAL_PID=''
    PERF_AUTH=()
    rm -rf "$WORK/keys"
}

scrape_start() {
    : >"$WORK/scrapes"
    (
        while :; do
            if curl -sf -o /dev/null "http://127.0.0.1:$METRICS_PORT/metrics"; then echo ok; else echo failed; fi >>"$WORK/scrapes"
            sleep 1
        done
    ) &
    SCRAPE_PID=$!
}
scrape_stop() { # sets SCRAPES to the number of answered scrapes; fails on any failed one
    kill -TERM "$SCRAPE_PID" 2>/dev/null || true
    wait "$SCRAPE_PID" 2>/dev/null || true
    SCRAPE_PID=''
    local failed
    SCRAPES=$(grep -c '^ok' "$WORK/scrapes" || true) failed=$(grep -c '^failed' "$WORK/scrapes" || true)
    [ "$SCRAPES" -gt 0 ] && [ "$failed" = 0 ] || { echo "scraping http://127.0.0.1:$METRICS_PORT/metrics: $SCRAPES answered, $failed failed" >&2; exit 1; }
}

if [[ " $CASES " = *" prod "* ]]; then
    stock_mode=''; [ "$PROD_MODE" = interrupt ] && stock_mode=--interrupt-mode
    for wl in $WORKLOADS; do for f in scraped plain stock; do : >"$WORK/$wl.$f.res"; done; done
    for r in $(seq 1 "$ROUNDS"); do
        for who in $(round_order "$r" agent stock); do
            if [ $who = agent ]; then
                start_local
                LVOL_BYTES=$PROD_SIZE ensure_filled "prod agent round $r"
                for wl in $WORKLOADS; do
                    for s in $(round_order "$r" scraped plain); do
                        [ $s = scraped ] && scrape_start
                        perf "$wl" >>"$WORK/$wl.$s.res"
                        extra=''
                        if [ $s = scraped ]; then scrape_stop; extra=" ($SCRAPES scrapes answered)"; fi
                        note "prod $wl round $r agent $s: $(tail -n1 "$WORK/$wl.$s.res")$extra"
                    done
                done
                stop_local
            else
                start_stock lvol "$stock_mode" "$WORK/stock-prod.img"
                ensure_filled "prod stock round $r"
                for wl in $WORKLOADS; do
                    perf "$wl" >>"$WORK/$wl.stock.res"
                    note "prod $wl round $r stock: $(tail -n1 "$WORK/$wl.stock.res")"
                done
                stop_target
            fi
        done
    done
    for wl in $WORKLOADS; do
        printf '%-10s %11.0f %11.0f %11.0f %7s %6s %7s %6s %9.1fus %9.1fus %9.1fus %9.1fus %5s%% %5s%%\n' "$wl" \
            "$(col "$wl.scraped" 1)" "$(col "$wl.plain" 1)" "$(col "$wl.stock" 1)" \
            $(ratio "$wl.scraped" "$wl.stock") $(ratio "$wl.scraped" "$wl.plain") \
            "$(col "$wl.scraped" 2)" "$(col "$wl.stock" 2)" "$(col "$wl.scraped" 3)" "$(col "$wl.stock" 3)" \
            "$(col "$wl.scraped" 4)" "$(col "$wl.stock" 4)" >>"$TABLE3"
    done
fi

# --- tables ----------------------------------------------------------------------------------

echo
echo "backing files before measuring (allocated = st_blocks x 512; apparent = size):"
sort -u "$WORK/backing.txt" | sed 's/^/  /'
if [ -s "$TABLE1" ]; then
    echo
    echo "agent's in-process target (bench_target) / stock nvmf_tgt, 4 KiB QD32, medians of $ROUNDS rounds:"
    printf '%-6s %-10s %12s %12s %7s %6s %11s %11s %11s %11s %6s %6s %6s\n' case workload agent_iops stock_iops ratio worst agent_mean stock_mean agent_p99 stock_p99 a_cpu s_cpu perf
    cat "$TABLE1"
fi
if [ -s "$TABLE2" ]; then
    echo
    echo "lvol / native: fio libaio O_DIRECT QD32 4 KiB, 1 job on core $NATIVE_CORE, on the lvol's $LVOL_MIB MiB extent of the same filled file, medians of $ROUNDS rounds:"
    printf '%-10s %11s %11s %7s %6s %11s %11s %7s %6s %11s %11s %6s\n' workload agent_lvol native_file ratio worst stock_lvol native_file ratio worst native_mean native_p99 fio_cpu
    cat "$TABLE2"
fi
if [ -s "$TABLE3" ]; then
    echo
    echo "production disk-agent via liteio-local (reactors ${PROD_MODE}ing on core 0) / stock nvmf_tgt, lvol on a filled 1 GiB aio file, medians of $ROUNDS rounds:"
    printf '%-10s %11s %11s %11s %7s %6s %7s %6s %11s %11s %11s %11s %6s %6s\n' workload agent_scrape agent_plain stock_iops ratio worst scr/pl worst agent_mean stock_mean agent_p99 stock_p99 a_cpu s_cpu
    cat "$TABLE3"
    echo "(agent_scrape: /metrics scraped every second during the run; scr/pl: agent with / without the scrape)"
fi
if [ -s "$TABLE1" ] || [ -s "$TABLE3" ]; then
    echo "(a_cpu, s_cpu: % of one core the agent's / stock target process received during the run, medians;"
    echo " perf: the same for spdk_nvme_perf; fio_cpu: fio's own usr+sys. Below 100 a polling target lost CPU to other processes.)"
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

idle_cpu() { # pid -> percent of one core over IDLE_SECONDS
    local hz; hz=$(getconf CLK_TCK)
    local t0; t0=$(awk '{print $14 + $15}' "/proc/$1/stat")
    sleep "$IDLE_SECONDS"
    local t1; t1=$(awk '{print $14 + $15}' "/proc/$1/stat")
    awk -v a="$t0" -v b="$t1" -v hz="$hz" -v s="$IDLE_SECONDS" 'BEGIN {printf "%.2f", (b - a) * 100 / hz / s}'
}
if [ "$IDLE_SECONDS" != 0 ]; then
    echo
    echo "idle CPU in interrupt mode over ${IDLE_SECONDS}s, lvol exported, no initiator (% of one core):"
    start_agent lvol --interrupt
    echo "  agent: $(idle_cpu "$TARGET_PID")%"
    stop_target
    start_stock lvol --interrupt-mode
    echo "  stock nvmf_tgt: $(idle_cpu "$TARGET_PID")%"
    stop_target
fi
