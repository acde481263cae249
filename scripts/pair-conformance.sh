#!/usr/bin/env bash
# libiscsi's conformance suite through an HA pair: two `lanes serve` nodes on loopback replicate
# one LUN (etcd on loopback as the witness), and `iscsi-test-cu --dataloss` gets one URL on
# node 1 and the second on node 2, so its multipath tests (reservations, COMPARE AND WRITE, the
# second initiator) run across the nodes. Prints the CUnit summary and every failed test, and
# fails when fewer than tests/conformance/pair-floor pass.
#
# Loopback only (127.0.0.1 for node 1, 127.0.0.2 for node 2). Everything it starts it stops,
# everything it creates it removes; the logs go to $LANES_PAIR_OUT (default target/pair-conformance).
# LANES_PAIR_TESTS picks tests (iscsi-test-cu --test), LANES_PAIR_LOG sets the nodes' RUST_LOG.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
lanes="$repo/target/release/lanes"
out=${LANES_PAIR_OUT:-$repo/target/pair-conformance}
floor_file="$repo/tests/conformance/pair-floor"
iqn="iqn.2026-11.io.lanes.test:pair"
timeout_s=${LANES_TEST_CU_TIMEOUT:-900}
for tool in etcd iscsi-test-cu timeout ss; do
    command -v "$tool" >/dev/null 2>&1 || { echo "pair-conformance: $tool not found (scripts/test.sh installs it)" >&2; exit 1; }
done
[ -x "$lanes" ] || cargo build --release -p lanes
work=$(mktemp -d "${TMPDIR:-/tmp}/lanes-pair.XXXXXX")
mkdir -p "$out"
pids=()
cleanup() {
    local status=$?
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    cp -f "$work"/*.log "$work"/node*.out "$out/" 2>/dev/null || true
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
etcd_client=$(free_port)
etcd_peer=$(free_port)
repl=$(free_port)
p1=$(free_port)
p2=$(free_port)

etcd --name witness --data-dir "$work/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "witness=http://127.0.0.1:$etcd_peer" >"$work/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do grep -q "ready to serve client requests" "$work/etcd.log" && break; sleep 0.1; done
grep -q "ready to serve client requests" "$work/etcd.log" || { echo "pair-conformance: etcd did not start" >&2; exit 1; }

# One configuration text for both nodes, each in its own directory (its own data and disk).
for n in 1 2; do
    mkdir -p "$work/node$n"
    cat >"$work/node$n/lanes.toml" <<CONF
[server]
data-dir = "data"

[cluster]
preferred = 1
name = "conformance"
etcd = ["127.0.0.1:$etcd_client"]
listen = "127.0.0.1:$repl"
peer = "127.0.0.2:$repl"
# This run measures SCSI behaviour, not failover: a busy machine that delays a few 100 ms
# heartbeats must not turn into a peer loss and an ALUA change in the middle of a test.
heartbeat = "500ms"

[[portal-group]]
tag = 1
node = 1
portals = ["127.0.0.1:$p1"]

[[portal-group]]
tag = 2
node = 2
portals = ["127.0.0.2:$p2"]

[[target]]
name = "$iqn"

[[target.lun]]
lun = 0
path = "disk0.img"
size = "256M"
CONF
done
for n in 1 2; do
    RUST_LOG=${LANES_PAIR_LOG:-warn} "$lanes" serve --config "$work/node$n/lanes.toml" --node "$n" \
        >"$work/node$n.out" 2>"$work/node$n.log" &
    pids+=($!)
done
status_of() { "$lanes" status --socket "$work/node$1/data/lanes.sock" 2>/dev/null || true; }
for _ in $(seq 600); do
    status_of 1 | grep -q Paired && status_of 2 | grep -q Paired && break
    sleep 0.1
done
status_of 1 | grep -q Paired && status_of 2 | grep -q Paired \
    || { echo "pair-conformance: the nodes did not pair" >&2; status_of 1; status_of 2; exit 1; }
echo "pair-conformance: node 1 on 127.0.0.1:$p1 and node 2 on 127.0.0.2:$p2 are paired"

started=$SECONDS
rc=0
timeout -k 10 "$timeout_s" iscsi-test-cu --dataloss ${LANES_PAIR_TESTS:+--test="$LANES_PAIR_TESTS"} \
    --initiator-name=iqn.2026-11.io.lanes.test:pair-a --initiator-name-2=iqn.2026-11.io.lanes.test:pair-b \
    "iscsi://127.0.0.1:$p1/$iqn/0" "iscsi://127.0.0.2:$p2/$iqn/0" >"$work/iscsi-test-cu.log" 2>&1 || rc=$?
echo "iscsi-test-cu exited $rc after $((SECONDS - started)) s"
summary=$(awk '$1 == "tests" {print $2, $3, $4, $5; exit}' "$work/iscsi-test-cu.log")
[ -n "$summary" ] || { tail -20 "$work/iscsi-test-cu.log"; echo "pair-conformance: no CUnit summary" >&2; exit 1; }
read -r total ran passed failed <<<"$summary"
# A test failed when CUnit prints its numbered assertion records after it ("    1. file.c:NN  -
# CU_ASSERT..."); libiscsi's own "[FAILED]" lines are log messages, in passing tests too.
awk '/^Suite: / { suite = substr($0, 8); sub(/[ \t\r]+$/, "", suite); test = ""; next }
     /^  Test: / { test = substr($0, 9); sub(/ \.\.\..*$/, "", test); shown = 0; next }
     test != "" && !shown && /^ +[0-9]+\. [^ ]+\.c:[0-9]+ +- / { print "  FAILED " suite "." test; shown = 1 }' \
    "$work/iscsi-test-cu.log" | head -100 || true
floor=$(tr -dc '0-9' <"$floor_file" 2>/dev/null || echo 0)
echo "pair conformance: $passed passed, $failed failed of $ran (floor ${floor:-0})"
[ "$passed" -ge "${floor:-0}" ] || { echo "pair-conformance: $passed < floor $floor" >&2; exit 1; }
