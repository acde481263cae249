#!/usr/bin/env bash
# libiscsi's conformance suite across two RBD gateways: a small Ceph cluster on a loopback
# address (scripts/ceph-cluster), one image, two `lanes serve` gateways exporting it (each its
# own portal group), and `iscsi-test-cu --dataloss` with one URL on gateway 1 and the second on
# gateway 2, so its multipath tests (reservations, COMPARE AND WRITE, the second initiator) run
# across gateways. Prints the CUnit summary and every failed test, and fails when fewer than
# tests/conformance/rbd-floor pass.
#
# Root only (Ceph's daemons). Loopback only: Ceph on 127.0.0.1, gateway 1 on 127.0.0.1,
# gateway 2 on 127.0.0.2. Everything it starts it stops, everything it creates it removes; the
# logs go to $LANES_RBD_OUT (default target/rbd-conformance). LANES_RBD_TESTS picks tests
# (iscsi-test-cu --test), LANES_RBD_LOG sets the gateways' RUST_LOG, LANES_BIN the lanes binary
# (default target/release/lanes). The test command runs it as crates/lanes/tests/rbd_conformance.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
lanes=${LANES_BIN:-$repo/target/release/lanes}
out=${LANES_RBD_OUT:-$repo/target/rbd-conformance}
floor_file="$repo/tests/conformance/rbd-floor"
iqn="iqn.2026-11.io.lanes.test:rbd"
timeout_s=${LANES_TEST_CU_TIMEOUT:-1200}
[ "$(id -u)" = 0 ] || { echo "rbd-conformance: run as root (Ceph's daemons)" >&2; exit 1; }
for tool in iscsi-test-cu timeout rbd; do
    command -v "$tool" >/dev/null 2>&1 || { echo "rbd-conformance: $tool not found (scripts/test.sh installs it)" >&2; exit 1; }
done
[ -x "$lanes" ] || cargo build --release -p lanes
work=$(mktemp -d "$("$repo/scripts/ceph-cluster" scratch)/lanes-rbd.XXXXXX")
mkdir -p "$out"
pids=()
cleanup() {
    local status=$?
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    cp -f "$work"/*.log "$work"/gw*.out "$out/" 2>/dev/null || true
    "$repo/scripts/ceph-cluster" down "$work/ceph" || true
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
"$repo/scripts/ceph-cluster" up "$work/ceph" 127.0.0.1 2 >"$work/ceph-up.log" 2>&1 \
    || { tail -20 "$work/ceph-up.log"; echo "rbd-conformance: the Ceph cluster did not start" >&2; exit 1; }
conf="$work/ceph/ceph.conf"
rbd -c "$conf" create rbd/conformance --size 256M --image-feature layering

p1=$(free_port)
p2=$(free_port)
# Each gateway: the same target and LUN (so the same WWID), its own portal group.
for n in 1 2; do
    port=$p1; [ "$n" = 2 ] && port=$p2
    mkdir -p "$work/gw$n"
    cat >"$work/gw$n/lanes.toml" <<CONF
[server]
data-dir = "data"

[[portal-group]]
tag = $n
portals = ["127.0.0.$n:$port"]

[[target]]
name = "$iqn"

[[target.lun]]
lun = 0
backend = "rbd"
pool = "rbd"
image = "conformance"
ceph-conf = "$conf"
CONF
    RUST_LOG=${LANES_RBD_LOG:-warn} "$lanes" serve --config "$work/gw$n/lanes.toml" \
        >"$work/gw$n.out" 2>"$work/gw$n.log" &
    pids+=($!)
done
for n in 1 2; do
    port=$p1; [ "$n" = 2 ] && port=$p2
    for _ in $(seq 300); do
        (exec 3<>"/dev/tcp/127.0.0.$n/$port") 2>/dev/null && break
        kill -0 "${pids[$((n - 1))]}" 2>/dev/null || { cat "$work/gw$n.log" >&2; echo "rbd-conformance: gateway $n exited" >&2; exit 1; }
        sleep 0.1
    done
done
echo "rbd-conformance: gateway 1 on 127.0.0.1:$p1 and gateway 2 on 127.0.0.2:$p2 export rbd/conformance"

started=$SECONDS
rc=0
timeout -k 10 "$timeout_s" iscsi-test-cu --dataloss ${LANES_RBD_TESTS:+--test="$LANES_RBD_TESTS"} \
    --initiator-name=iqn.2026-11.io.lanes.test:rbd-a --initiator-name-2=iqn.2026-11.io.lanes.test:rbd-b \
    "iscsi://127.0.0.1:$p1/$iqn/0" "iscsi://127.0.0.2:$p2/$iqn/0" >"$work/iscsi-test-cu.log" 2>&1 || rc=$?
echo "iscsi-test-cu exited $rc after $((SECONDS - started)) s"
summary=$(awk '$1 == "tests" {print $2, $3, $4, $5; exit}' "$work/iscsi-test-cu.log")
[ -n "$summary" ] || { tail -20 "$work/iscsi-test-cu.log"; echo "rbd-conformance: no CUnit summary" >&2; exit 1; }
read -r total ran passed failed <<<"$summary"
# A test failed when CUnit prints its numbered assertion records after it ("    1. file.c:NN  -
# CU_ASSERT..."); libiscsi's own "[FAILED]" lines are log messages, in passing tests too.
awk '/^Suite: / { suite = substr($0, 8); sub(/[ \t\r]+$/, "", suite); test = ""; next }
     /^  Test: / { test = substr($0, 9); sub(/ \.\.\..*$/, "", test); shown = 0; next }
     test != "" && !shown && /^ +[0-9]+\. [^ ]+\.c:[0-9]+ +- / { print "  FAILED " suite "." test; shown = 1 }' \
    "$work/iscsi-test-cu.log" | head -100 || true
floor=$(tr -dc '0-9' <"$floor_file" 2>/dev/null || echo 0)
echo "rbd conformance: $passed passed, $failed failed of $ran (floor ${floor:-0})"
[ "$passed" -ge "${floor:-0}" ] || { echo "rbd-conformance: $passed < floor $floor" >&2; exit 1; }
