# Runs one test tier with cargo and accounts for it honestly. Sourced by scripts/test.sh and
# by its own test (tests/tests/t0_test_script.rs), which drives it against throw-away crates.
#
# Globals read:    log_dir (where each tier's full log goes), LITEIO_TEST_TIER_TIMEOUT (seconds
#                  one tier may take, default 2400).
# Globals written: summary (one line per tier), total_pass, total_fail, total_skip.
#
# A tier FAILS, whatever its tests said, when
#   - cargo exits non-zero for any reason: a test failed, a target did not compile or link,
#     a test binary crashed (signal, abort) or exited non-zero without a result line;
#   - it runs longer than the timeout (the whole cargo process group is killed);
#   - it should run but executes no test at all (no `test result:` line counting a test).
# The summary line names the reason after the counts, e.g.
#   `T3: 0 passed, 1 failed, 0 skipped (real SPDK) FAILED: did not build (see …/T3.log)`.
#
# A test that cannot run here passes after printing `SKIP <why>` (or `Tn … skipped`); it is
# counted as skipped, not passed.

summary=()
total_pass=0 total_fail=0 total_skip=0

tier_say() { printf '==> %s\n' "$*"; }

# Sum of the numbers that `sed -n "$1"` extracts from file $2 (0 when none).
tier_sum() {
    sed -n "$1" "$2" | awk '{ s += $1 } END { print s + 0 }'
}

# One line per panic in test log $1: the test (from the `---- name stdout ----` header it
# came under), where it panicked and the first line of its message.
tier_panics() {
    awk '
        /^---- .* stdout ----$/ { test = $2 }
        want { sub(/^[ \t]+/, ""); print "panic: " test ": " at ": " substr($0, 1, 300); want = 0; next }
        /panicked at / { at = $0; sub(/.*panicked at /, "", at); sub(/:$/, "", at); want = 1 }
    ' "$1"
}

# run_tier NAME LABEL -- cargo test args...
run_tier() {
    local name=$1 label=$2
    shift 3
    local log="$log_dir/$name.log"
    local limit=${LITEIO_TEST_TIER_TIMEOUT:-2400}
    tier_say "$name $label: cargo test $* (timeout ${limit}s)"
    # timeout puts cargo and the test binaries in a process group of their own and kills the
    # whole group when the limit is reached.
    timeout --kill-after=20 "$limit" cargo test --locked --no-fail-fast "$@" >"$log" 2>&1 &
    local pid=$!
    # Show the interesting lines while it runs; the full output stays in the log.
    tail -n +1 -f --pid="$pid" "$log" 2>/dev/null |
        grep --line-buffered -E '^(test result|failures:|---- | *panicked|error(\[|:)|SKIP|T[0-9].* skipped|.*process didn.t exit successfully)'
    wait "$pid"
    local status=$?

    local pass fail ign
    pass=$(tier_sum 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed.*/\1/p' "$log")
    fail=$(tier_sum 's/^test result: .* \([0-9]*\) failed.*/\1/p' "$log")
    ign=$(tier_sum 's/^test result: .* \([0-9]*\) ignored.*/\1/p' "$log")
    local ran=$((pass + fail))
    local skips
    skips=$(grep -cE '^(SKIP|T[0-9].* skipped)' "$log")
    skips=${skips:-0}
    [ "$skips" -gt "$pass" ] && skips=$pass
    pass=$((pass - skips)) ign=$((ign + skips))

    # Why the tier failed beyond its failed tests, most specific first.
    local why=""
    # cargo prints "process didn't exit successfully: … (signal: N …)" for a binary that died
    # and "(exit status: N)" for one that exited non-zero; a binary with failed tests also
    # prints a "test result: FAILED" line, so more non-zero exits than FAILED results means a
    # binary exited without reporting.
    local signalled exited reported lost=1
    signalled=$(grep -cE "process didn't exit successfully: .*\(signal: " "$log")
    exited=$(grep -cE "process didn't exit successfully: .*\(exit status: " "$log")
    reported=$(grep -cE '^test result: FAILED' "$log")
    if [ "$status" = 124 ] || [ "$status" = 137 ]; then
        why="timed out after ${limit}s"
    elif grep -qE '^error(\[E[0-9]+\])?: (could not compile|linking with|failed to run custom build command|no matching package|failed to (select|load|parse|get)|the lock file .* needs to be updated)' "$log" \
        || { [ "$status" != 0 ] && [ "$ran" = 0 ] && [ "$signalled" = 0 ] && [ "$exited" = 0 ]; }; then
        why="did not build"
    elif [ "$signalled" -gt 0 ] || [ "$exited" -gt "$reported" ]; then
        why="a test binary crashed"
        # Each binary that died unreported counts as one failed test at least.
        lost=$((signalled + (exited > reported ? exited - reported : 0)))
    elif [ "$status" != 0 ] && [ "$fail" = 0 ]; then
        why="cargo exited with status $status"
    elif [ "$ran" = 0 ]; then
        why="ran no test"
    fi
    [ -z "$why" ] || fail=$((fail + lost))
    local line="$name: $pass passed, $fail failed, $ign skipped ($label)"
    if [ -n "$why" ]; then
        line="$line FAILED: $why (see $log)"
        tier_say "FAILED: $name $why; see $log"
    elif [ "$fail" != 0 ]; then
        line="$line FAILED: $fail test(s) failed (see $log)"
    fi
    summary+=("$line")
    # Where each failed test panicked, so the summary alone says what broke.
    if [ "$fail" != 0 ]; then
        local where
        while IFS= read -r where; do
            summary+=("  $where")
        done < <(tier_panics "$log" | head -n 20)
    fi
    total_pass=$((total_pass + pass)) total_fail=$((total_fail + fail)) total_skip=$((total_skip + ign))
}

# skip_tier NAME WHY: a tier that cannot run here counts as one skip, with its reason.
skip_tier() {
    summary+=("$1: 0 passed, 0 failed, 1 skipped ($2)")
    total_skip=$((total_skip + 1))
    tier_say "$1 skipped: $2"
}
