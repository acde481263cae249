#!/usr/bin/env bash
# Interop with real iSCSI peers against a freshly built `lanes serve`: libiscsi's command-line
# tools (discovery, INQUIRY, READ CAPACITY(16)), QEMU's libiscsi block driver (a 64 MiB write
# through one portal read back through the other, on a 512-byte and a 4096-byte LUN; write and
# read benches) and libiscsi's conformance suite iscsi-test-cu, whose pass count must not fall
# below tests/conformance/floor; then a live reconfiguration (`lanes reload` grows a LUN and adds
# one) seen by iscsi-readcapacity16 and iscsi-ls.
#
# Loopback only (127.0.0.1 and 127.0.0.2). Everything it starts it stops, everything it creates
# it removes (trap EXIT), except the logs copied to $LANES_INTEROP_OUT (default target/interop).
#
# Environment:
#   LANES_INTEROP_OUT          where logs are kept (default target/interop)
#   LANES_TEST_CU_TIMEOUT      seconds allowed for iscsi-test-cu (default 480)
#   LANES_INTEROP_SKIP_BUILD=1 use the existing target/release/lanes
set -euo pipefail
cd "$(dirname "$0")/.."
repo_root=$(pwd)

target_iqn="iqn.2026-11.io.lanes.test:interop"
initiator_a="iqn.2026-11.io.lanes.test:initiator-a"
initiator_b="iqn.2026-11.io.lanes.test:initiator-b"
lun_size=$((256 * 1024 * 1024))
data_size=$((64 * 1024 * 1024))
tool_timeout=120
test_cu_timeout=${LANES_TEST_CU_TIMEOUT:-480}
floor_file="$repo_root/tests/conformance/floor"
out_dir=${LANES_INTEROP_OUT:-$repo_root/target/interop}
lanes="$repo_root/target/release/lanes"

step() { printf '\n==> %s\n' "$*"; }
die() {
    echo "interop: FATAL: $*" >&2
    exit 1
}

for tool in iscsi-ls iscsi-inq iscsi-readcapacity16 iscsi-test-cu qemu-img ss timeout cmp; do
    command -v "$tool" >/dev/null 2>&1 \
        || die "$tool not found (apt-get install libiscsi-bin qemu-utils qemu-block-extra iproute2)"
done

# --- temp dir, server bookkeeping, cleanup -------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/lanes-interop.XXXXXX")
mkdir -p "$out_dir"
server_pid=""
cu_pid=""
server_log="$work/server.stderr"
server_out="$work/server.stdout"

stop_server() {
    [ -n "$server_pid" ] || return 0
    if kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        local deadline=$((SECONDS + 10))
        while kill -0 "$server_pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
            sleep 0.1
        done
        if kill -0 "$server_pid" 2>/dev/null; then
            echo "interop: server $server_pid ignored SIGTERM for 10 s, sending SIGKILL" >&2
            kill -KILL "$server_pid" 2>/dev/null || true
        fi
    fi
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [ -n "$cu_pid" ] && kill -0 "$cu_pid" 2>/dev/null; then
        kill -TERM "$cu_pid" 2>/dev/null || true # timeout(1) passes it on to iscsi-test-cu
        wait "$cu_pid" 2>/dev/null || true
    fi
    stop_server
    # Keep the logs for a post-mortem; the disks and data files go.
    for f in server.stderr server.stdout iscsi-test-cu.log; do
        if [ -f "$work/$f" ]; then cp -f "$work/$f" "$out_dir/$f" 2>/dev/null || true; fi
    done
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

show_server_log() {
    echo "---- lanes serve stderr (last 80 lines, full log in $out_dir/server.stderr) ----" >&2
    tail -n 80 "$server_log" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' >&2 || true
    echo "---- end of server log ----" >&2
}

# --- check bookkeeping ---------------------------------------------------------------------------
checks_passed=0
checks_failed=0
failed_checks=()

pass() {
    checks_passed=$((checks_passed + 1))
    echo "  ok    $1"
}
fail() {
    checks_failed=$((checks_failed + 1))
    failed_checks+=("$1")
    echo "  FAIL  $1" >&2
    if [ -n "${2:-}" ] && [ -f "$2" ]; then
        echo "  ---- output of the failing command ----" >&2
        tail -n 40 "$2" | sed 's/^/  | /' >&2
    fi
}

# check NAME COMMAND...: runs COMMAND (bounded by $tool_timeout) with output to a log.
check_log=""
check() {
    local name=$1
    shift
    check_log="$work/check.$((checks_passed + checks_failed)).log"
    if timeout -k 5 "$tool_timeout" "$@" >"$check_log" 2>&1; then
        pass "$name"
        return 0
    else
        local rc=$?
        [ "$rc" = 124 ] && echo "  (timed out after ${tool_timeout}s)" >>"$check_log"
        fail "$name (exit $rc)" "$check_log"
        return 1
    fi
}

# expect NAME PATTERN: the last check's output must contain PATTERN (grep -E).
expect() {
    if grep -qE -- "$2" "$check_log"; then
        pass "$1"
    else
        fail "$1: no line matches /$2/" "$check_log"
    fi
}

server_alive() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        pass "server still running after $1"
    else
        local server_rc=0
        [ -n "$server_pid" ] && { wait "$server_pid" 2>/dev/null || server_rc=$?; }
        fail "server died during $1 (exit status $server_rc)"
        server_pid=""
        show_server_log
        if grep -q 'shutting down' "$server_log"; then
            echo "interop: lanes serve logged 'shutting down': it got SIGTERM or SIGINT from a" \
                "process outside this script (a broad pkill/killall?), it did not crash" >&2
        fi
        die "the server is gone; later checks would only fail"
    fi
}

# --- build ---------------------------------------------------------------------------------------
if [ "${LANES_INTEROP_SKIP_BUILD:-0}" != 1 ]; then
    step "cargo build --release -p lanes"
    cargo build --release -p lanes
fi
[ -x "$lanes" ] || die "$lanes was not built"
echo "testing $lanes built from $(git describe --always --dirty 2>/dev/null || echo 'an unknown revision')"

# --- start the server on a free port -------------------------------------------------------------
port_is_free() {
    # Listening sockets on this port on any address (0.0.0.0, 127.0.0.x, ::).
    [ -z "$(ss -Hltn "( sport = :$1 )" 2>/dev/null)" ]
}

tcp_open() { timeout 2 bash -c "</dev/tcp/$1/$2" 2>/dev/null; }

# write_config PORT LUN0_SIZE [EXTRA]: the server's configuration file (EXTRA: more TOML).
config="$work/lanes.toml"
write_config() {
    cat >"$config" <<EOF
[server]
data-dir = "$work/data"

[[portal-group]]
tag = 1
portals = ["127.0.0.1:$1", "127.0.0.2:$1"]

[[target]]
name = "$target_iqn"

[[target.lun]]
path = "$work/d512.img"
size = "$2"
block-size = 512

[[target.lun]]
path = "$work/d4k.img"
size = "256M"
block-size = 4096
${3:-}
EOF
}

# start_server PORT: returns 0 when ready, 2 if the port was taken meanwhile, 1 on other failures.
start_server() {
    local port=$1
    : >"$server_log"
    : >"$server_out"
    write_config "$port" 256M
    RUST_LOG=${RUST_LOG:-info} RUST_BACKTRACE=1 "$lanes" serve --config "$config" \
        --log-format text >"$server_out" 2>"$server_log" &
    server_pid=$!
    # Ready = the banner line on stdout, then both portals accept connections.
    local deadline=$((SECONDS + 30))
    until grep -q '^lanes serve is ready' "$server_out"; do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            wait "$server_pid" 2>/dev/null || true
            server_pid=""
            grep -q 'Address already in use' "$server_log" && return 2
            echo "interop: lanes serve exited before it was ready" >&2
            show_server_log
            return 1
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "interop: no 'lanes serve is ready' banner within 30 s" >&2
            show_server_log
            return 1
        fi
        sleep 0.1
    done
    local address
    for address in 127.0.0.1 127.0.0.2; do
        until tcp_open "$address" "$port"; do
            if [ "$SECONDS" -ge "$deadline" ]; then
                echo "interop: banner printed but $address:$port does not accept connections" >&2
                show_server_log
                return 1
            fi
            sleep 0.1
        done
    done
    return 0
}

step "starting lanes serve"
port=""
for attempt in 1 2 3 4 5 6 7 8; do
    candidate=$((13260 + RANDOM % 2000))
    port_is_free "$candidate" || continue
    rm -rf "$work/data" "$work"/d*.img
    mkdir -p "$work/data"
    if start_server "$candidate"; then
        port=$candidate
        break
    else
        rc=$?
        [ "$rc" = 2 ] && { echo "port $candidate was taken meanwhile, trying another"; continue; }
        die "lanes serve did not start (attempt $attempt)"
    fi
done
[ -n "$port" ] || die "no free port found in 13260..15259 after 8 attempts"
pass "lanes serve ready on 127.0.0.1:$port and 127.0.0.2:$port (pid $server_pid)"

url1="iscsi://127.0.0.1:$port/$target_iqn"
url2="iscsi://127.0.0.2:$port/$target_iqn"
started=$SECONDS

# --- libiscsi tools ------------------------------------------------------------------------------
step "libiscsi tools: iscsi-ls, iscsi-inq, iscsi-readcapacity16"
if check "iscsi-ls -s (SendTargets discovery)" iscsi-ls -s "iscsi://127.0.0.1:$port"; then
    expect "discovery lists $target_iqn on portal 127.0.0.1:$port" \
        "^Target:$target_iqn Portal:127\.0\.0\.1:$port,"
    expect "discovery lists $target_iqn on portal 127.0.0.2:$port" \
        "^Target:$target_iqn Portal:127\.0\.0\.2:$port,"
    expect "discovery shows LUN 0 and LUN 1" "^Lun:1 "
fi
for lun in 0 1; do
    if check "iscsi-inq LUN $lun" iscsi-inq "$url1/$lun"; then
        expect "iscsi-inq LUN $lun is a connected direct-access device" \
            "^Peripheral Device Type:DIRECT_ACCESS"
    fi
done
for lun in 0 1; do
    block_size=$([ "$lun" = 0 ] && echo 512 || echo 4096)
    if check "iscsi-readcapacity16 LUN $lun via 127.0.0.2" iscsi-readcapacity16 "$url2/$lun"; then
        expect "LUN $lun has $block_size-byte blocks" "^LOGICAL BLOCK LENGTH IN BYTES:$block_size\$"
        expect "LUN $lun is 256 MiB" "^Total size:$lun_size\$"
    fi
done
server_alive "the libiscsi tools"

# --- QEMU's libiscsi driver: data integrity across portals, benches ------------------------------
step "qemu-img (libiscsi driver): 64 MiB written via 127.0.0.1, read back via 127.0.0.2"
head -c "$data_size" /dev/urandom >"$work/random.bin"
for lun in 0 1; do
    opts1="driver=iscsi,transport=tcp,portal=127.0.0.1:$port,target=$target_iqn,lun=$lun"
    opts2="driver=iscsi,transport=tcp,portal=127.0.0.2:$port,target=$target_iqn,lun=$lun"
    readback="$work/readback.$lun.bin"
    if check "qemu-img convert random.bin -> LUN $lun via 127.0.0.1" \
        qemu-img convert -n -f raw --target-image-opts "$work/random.bin" "$opts1"; then
        if check "qemu-img convert LUN $lun via 127.0.0.2 -> file" \
            qemu-img convert -f raw -O raw "$url2/$lun" "$readback"; then
            if check "LUN $lun: first 64 MiB read back equal what was written" \
                cmp -n "$data_size" "$work/random.bin" "$readback"; then
                # The rest of a fresh sparse LUN must read as zeros.
                check "LUN $lun: remaining 192 MiB read back as zeros" \
                    cmp -n $((lun_size - data_size)) -i "$data_size:0" "$readback" /dev/zero || true
            fi
        fi
    fi
    rm -f "$readback"
    if check "qemu-img bench write 4 KiB x2000 qd16 LUN $lun via 127.0.0.1" \
        qemu-img bench -w -s 4096 -d 16 -c 2000 --image-opts "$opts1"; then
        expect "write bench on LUN $lun completed" "^Run completed in"
    fi
    if check "qemu-img bench read 4 KiB x2000 qd16 LUN $lun via 127.0.0.2" \
        qemu-img bench -s 4096 -d 16 -c 2000 --image-opts "$opts2"; then
        expect "read bench on LUN $lun completed" "^Run completed in"
    fi
    if check "qemu-img bench write 256 KiB x400 qd8 LUN $lun via 127.0.0.2" \
        qemu-img bench -w -s 262144 -d 8 -c 400 -o $((128 * 1024 * 1024)) --image-opts "$opts2"; then
        expect "large write bench on LUN $lun completed" "^Run completed in"
    fi
    # Large reads on both LUNs: QEMU 7.2's iscsi driver asserts on 4096-byte LUNs that report
    # LBPRZ=1, which is why lanes reports LBPRZ=0 there (docs/CONFORMANCE.md).
    if check "qemu-img bench read 256 KiB x400 qd8 LUN $lun via 127.0.0.1" \
        qemu-img bench -s 262144 -d 8 -c 400 --image-opts "$opts1"; then
        expect "large read bench on LUN $lun completed" "^Run completed in"
    fi
    if check "qemu-img bench read 1 MiB x100 qd1 LUN $lun via 127.0.0.2" \
        qemu-img bench -s 1048576 -d 1 -c 100 --image-opts "$opts2"; then
        expect "1 MiB read bench on LUN $lun completed" "^Run completed in"
    fi
done
rm -f "$work/random.bin"
server_alive "the qemu-img checks"

# --- conformance: libiscsi iscsi-test-cu ---------------------------------------------------------
step "iscsi-test-cu --dataloss (LUN 0, second path via 127.0.0.2; timeout ${test_cu_timeout}s)"
cu_log="$work/iscsi-test-cu.log"
cu_list="$work/iscsi-test-cu.list"
iscsi-test-cu -l >"$cu_list"
cu_started=$SECONDS
timeout -k 10 "$test_cu_timeout" iscsi-test-cu --dataloss \
    --initiator-name="$initiator_a" --initiator-name-2="$initiator_b" \
    "$url1/0" "$url2/0" >"$cu_log" 2>&1 &
cu_pid=$!
# If the server dies, libiscsi reconnects forever: stop the suite at once instead of waiting for
# the timeout.
server_lost=0
while kill -0 "$cu_pid" 2>/dev/null; do
    if ! kill -0 "$server_pid" 2>/dev/null; then
        server_lost=1
        kill -TERM "$cu_pid" 2>/dev/null || true
        break
    fi
    sleep 0.5
done
cu_rc=0
wait "$cu_pid" || cu_rc=$?
cu_pid=""
cu_seconds=$((SECONDS - cu_started))
echo "iscsi-test-cu exited with $cu_rc after ${cu_seconds}s; full output in $out_dir/iscsi-test-cu.log"

# Name every test FAMILY.SUITE.TEST. The basic runner prints "Suite: SUITE" without the family;
# suites run in the order `iscsi-test-cu -l` lists them (ALL, SCSI, iSCSI, LINUX), so the n-th
# "Suite:" line is the n-th FAMILY.SUITE that has tests in that list. A test failed when CUnit
# prints its numbered assertion records ("    1. file.c:NN  - CU_ASSERT...") after it; the
# "[FAILED]" lines libiscsi prints are log messages and appear in passing tests too.
cu_results="$work/iscsi-test-cu.results"
awk '
    NR == FNR {
        if (split($0, part, ".") == 3) {
            suite = part[1] "." part[2]
            if (suite != last) { suites[++nsuites] = suite; last = suite }
        }
        next
    }
    /^Suite: / {
        flush()
        name = substr($0, 8); sub(/[ \t\r]+$/, "", name)
        n++
        full = (n in suites && suites[n] ~ ("\\." name "$")) ? suites[n] : ("?." name)
        test = ""
        next
    }
    /^  Test: / {
        flush()
        test = substr($0, 9); sub(/ \.\.\..*$/, "", test)
        failed = 0; done = 0; skipped = 0; why = ""
        if ($0 ~ /\[SKIPPED\]/) skipped = 1
        if ($0 ~ /\.\.\.passed[ \t]*$/ || $0 ~ /\.\.\.passed[ \t]/) done = 1
        next
    }
    test != "" && /^ +[0-9]+\. [^ ]+\.c:[0-9]+ +- / {
        failed = 1; done = 1
        line = $0; sub(/^ +/, "", line)
        why = (why == "" ? line : why " | " line)
        next
    }
    test != "" && /\[SKIPPED\]/ { skipped = 1 }
    test != "" && /(^|[^A-Z[])(passed|FAILED)([ \t]|$)/ { done = 1 }
    /^Run Summary:/ { flush(); test = "" }
    function flush() {
        if (test == "") return
        print (failed ? "FAIL" : (!done ? "UNFINISHED" : (skipped ? "SKIP" : "PASS"))) "\t" full "." test "\t" why
    }
    END { flush() }
' "$cu_list" "$cu_log" >"$cu_results" || true

summary=$(grep -E '^ +tests +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+' "$cu_log" | tail -n 1 || true)
floor=0
[ -f "$floor_file" ] && floor=$(tr -dc '0-9' <"$floor_file")
floor=${floor:-0}
if [ -z "$summary" ]; then
    # No CUnit summary: the run hung (timeout) or crashed.
    unfinished=$(awk -F'\t' '$1 == "UNFINISHED" { print $2 }' "$cu_results" | tail -n 1)
    if [ "$server_lost" = 1 ]; then
        fail "lanes serve exited while iscsi-test-cu ran (in ${unfinished:-unknown})" "$cu_log"
    elif [ "$cu_rc" = 124 ] || [ "$cu_rc" = 137 ]; then
        fail "iscsi-test-cu did not finish within ${test_cu_timeout}s; still running: ${unfinished:-unknown}" "$cu_log"
    else
        fail "iscsi-test-cu ended (exit $cu_rc) without a CUnit summary; last test: ${unfinished:-unknown}" "$cu_log"
    fi
    [ "$server_lost" = 1 ] || show_server_log
else
    read -r _ cu_total cu_ran cu_passed cu_failed _ <<<"$summary"
    echo "failing tests (FAMILY.SUITE.TEST: failed assertions):"
    awk -F'\t' '$1 == "FAIL" { n++; printf "  %s: %s\n", $2, $3 } END { if (!n) print "  none" }' "$cu_results"
    cu_skipped=$(awk -F'\t' '$1 == "SKIP"' "$cu_results" | wc -l)
    echo "conformance: $cu_passed passed, $cu_failed failed of $cu_ran (floor $floor)"
    echo "  ($cu_skipped of the passed tests only printed [SKIPPED]: feature not offered or" \
        "option not given; CUnit counts them as passed)"
    if [ "$cu_ran" != "$cu_total" ]; then
        echo "  note: $cu_total tests registered, $cu_ran ran"
    fi
    if [ "$cu_passed" -lt "$floor" ]; then
        fail "conformance: $cu_passed passed < floor $floor (a regression; failing tests listed above)"
    else
        pass "conformance: $cu_passed passed >= floor $floor"
        if [ "$cu_passed" -gt "$floor" ]; then
            echo "  note: more tests pass than the floor; raise tests/conformance/floor to $cu_passed"
        fi
    fi
fi
server_alive "iscsi-test-cu"

# --- live reconfiguration ------------------------------------------------------------------------
step "lanes reload: LUN 0 grows to 320 MiB, LUN 2 (64 MiB) is added"
write_config "$port" 320M "
[[target.lun]]
lun = 2
path = \"$work/d2.img\"
size = \"64M\""
if check "lanes reload" "$lanes" reload --socket "$work/data/lanes.sock"; then
    expect "the reload grew LUN 0" "LUN 0 grown to $((320 * 1024 * 1024)) bytes"
    expect "the reload added LUN 2" "LUN 2 added"
fi
if check "iscsi-readcapacity16 LUN 0 after the reload" iscsi-readcapacity16 "$url2/0"; then
    expect "LUN 0 is now 320 MiB" "^Total size:$((320 * 1024 * 1024))\$"
fi
if check "iscsi-ls -s after the reload" iscsi-ls -s "iscsi://127.0.0.1:$port"; then
    expect "iscsi-ls shows the new LUN 2" "^Lun:2 "
fi
server_alive "the reload"

# --- the server log ------------------------------------------------------------------------------
step "server log"
if grep -qE 'panicked at|thread .* panicked' "$server_log"; then
    fail "lanes serve panicked (see $out_dir/server.stderr)"
    grep -E -A5 'panicked at' "$server_log" | sed 's/\x1b\[[0-9;]*m//g' | head -n 40 >&2
else
    pass "no panic in the server log"
fi
stop_server
echo "interop checks took $((SECONDS - started))s (iscsi-test-cu ${cu_seconds}s)"

echo
if [ "$checks_failed" -gt 0 ]; then
    echo "failed checks:"
    printf '  %s\n' "${failed_checks[@]}"
fi
echo "$checks_passed passed, $checks_failed failed"
[ "$checks_failed" = 0 ]
