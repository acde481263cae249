#!/usr/bin/env bash
# Reference run: libiscsi's iscsi-test-cu against tgt (the Linux userspace SCSI target) set up
# like scripts/interop.sh sets up lanes (a 256 MiB file LU, 512-byte blocks, two loopback
# portals), so the two pass counts in docs/CONFORMANCE.md are comparable. Not part of CI; run by
# hand as root: tests/conformance/tgt-baseline.sh [OUTPUT_LOG]
#
# tgt's LUN 0 is its own controller LU, so the disk is LUN 1. tgtd gets a private control port
# (-C) so it never talks to another tgtd on this machine. Everything it starts it stops, every
# file it creates it removes, except OUTPUT_LOG (default target/interop/tgt-iscsi-test-cu.log).
set -euo pipefail
cd "$(dirname "$0")/../.."

[ "$(id -u)" = 0 ] || { echo "tgt-baseline: tgtd needs root" >&2; exit 1; }
for tool in tgtd tgtadm iscsi-test-cu ss timeout; do
    command -v "$tool" >/dev/null || { echo "tgt-baseline: $tool not found" >&2; exit 1; }
done

target_iqn="iqn.2026-11.io.lanes.test:tgt-baseline"
out_log=${1:-target/interop/tgt-iscsi-test-cu.log}
mkdir -p "$(dirname "$out_log")"
work=$(mktemp -d "${TMPDIR:-/tmp}/lanes-tgt-baseline.XXXXXX")
tgtd_pid=""
control_port=""

cleanup() {
    local status=$?
    trap - EXIT
    if [ -n "$tgtd_pid" ] && kill -0 "$tgtd_pid" 2>/dev/null; then
        tgtadm -C "$control_port" --op update --mode sys --name State -v offline >/dev/null 2>&1 || true
        tgtadm -C "$control_port" --lld iscsi --op delete --mode target --tid 1 --force >/dev/null 2>&1 || true
        kill -TERM "$tgtd_pid" 2>/dev/null || true
        local deadline=$((SECONDS + 10))
        while kill -0 "$tgtd_pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
        kill -KILL "$tgtd_pid" 2>/dev/null || true
        wait "$tgtd_pid" 2>/dev/null || true
        # tgtd leaves its control socket behind when it is terminated.
        rm -f "/var/run/tgtd/socket.$control_port" "/var/run/tgtd/socket.$control_port.lock"
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

# A free TCP port and a control port whose socket does not exist yet.
port=""
for _ in $(seq 20); do
    candidate=$((15300 + RANDOM % 1000))
    if [ -z "$(ss -Hltn "( sport = :$candidate )")" ]; then port=$candidate; break; fi
done
[ -n "$port" ] || { echo "tgt-baseline: no free port" >&2; exit 1; }
control_port=""
for _ in $(seq 20); do
    candidate=$((2000 + RANDOM % 5000))
    if [ ! -e "/var/run/tgtd/socket.$candidate" ]; then control_port=$candidate; break; fi
done
[ -n "$control_port" ] || { echo "tgt-baseline: no free control port" >&2; exit 1; }

truncate -s 256M "$work/disk.img"
tgtd -f -C "$control_port" --iscsi "portal=127.0.0.1:$port" >"$work/tgtd.log" 2>&1 &
tgtd_pid=$!

deadline=$((SECONDS + 20))
until tgtadm -C "$control_port" --op show --mode sys >/dev/null 2>&1 \
    && timeout 2 bash -c "</dev/tcp/127.0.0.1/$port" 2>/dev/null; do
    if ! kill -0 "$tgtd_pid" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
        echo "tgt-baseline: tgtd did not come up on 127.0.0.1:$port" >&2
        cat "$work/tgtd.log" >&2
        exit 1
    fi
    sleep 0.1
done
tgtadm -C "$control_port" --lld iscsi --op new --mode target --tid 1 -T "$target_iqn"
tgtadm -C "$control_port" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$work/disk.img"
tgtadm -C "$control_port" --lld iscsi --op bind --mode target --tid 1 -I ALL
tgtadm -C "$control_port" --lld iscsi --op new --mode portal --param "portal=127.0.0.2:$port" \
    || echo "tgt-baseline: could not add portal 127.0.0.2:$port; MultipathIO uses one address twice"
second=127.0.0.2
timeout 2 bash -c "</dev/tcp/127.0.0.2/$port" 2>/dev/null || second=127.0.0.1

echo "tgt $(tgtd --version 2>&1 | head -n1) on 127.0.0.1:$port and $second:$port, disk = LUN 1"
started=$SECONDS
rc=0
timeout -k 10 900 iscsi-test-cu --dataloss \
    --initiator-name=iqn.2026-11.io.lanes.test:initiator-a \
    --initiator-name-2=iqn.2026-11.io.lanes.test:initiator-b \
    "iscsi://127.0.0.1:$port/$target_iqn/1" "iscsi://$second:$port/$target_iqn/1" \
    >"$out_log" 2>&1 || rc=$?
echo "iscsi-test-cu exited with $rc after $((SECONDS - started))s; output in $out_log"
grep -E '^ +(suites|tests|asserts) ' "$out_log" || echo "no CUnit summary (hung or crashed?)"
