#!/usr/bin/env bash
# The README's two commands, as a new user types them. The first code block of "Quick start"
# runs verbatim (reusing this checkout's build) inside a network namespace this script creates
# (only loopback in it, so the default wildcard portal 0.0.0.0:3260 never meets another test or
# address), must print the ready banner, and must exit 0 on SIGINT (Ctrl-C). The second block
# must be the command .ci/run calls. Everything it creates it removes (trap EXIT).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

die() { echo "readme-check: FAIL: $*" >&2; exit 1; }

# The fenced sh blocks of the Quick start section, one per element of `blocks`.
mapfile -t blocks < <(awk '
    /^## Quick start/ { in_section = 1; next }
    /^## / && in_section { exit }
    in_section && /^```sh$/ { in_block = 1; text = ""; next }
    in_section && in_block && /^```$/ { in_block = 0; gsub(/\n$/, "", text); print text; next }
    in_block { text = text $0 "\n" }
' README.md)
[ "${#blocks[@]}" -ge 2 ] || die "README.md's Quick start has ${#blocks[@]} sh blocks, expected 2"
run_block=${blocks[0]}
test_block=${blocks[1]}
ci_command=$(grep -vE '^(#|set |cd |$)' .ci/run | sed 's/^exec //')
[ "$test_block" = "$ci_command" ] \
    || die "README's test command '$test_block' is not what .ci/run runs ('$ci_command')"
echo "readme-check: test command '$test_block' is what .ci/run runs"

ns="lanes-readme-$$"
work=$(mktemp -d "${TMPDIR:-/tmp}/lanes-readme.XXXXXX")
data_existed=0
[ -e lanes-data ] && data_existed=1
pid=""
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
    ip netns delete "$ns" 2>/dev/null || true
    [ "$data_existed" = 1 ] || rm -rf "$repo/lanes-data"
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT INT TERM

ip netns add "$ns"
ip -n "$ns" link set lo up
echo "readme-check: running '$run_block' in network namespace $ns"
# setsid: its own process group, so SIGINT reaches it as Ctrl-C would reach a terminal's job.
setsid ip netns exec "$ns" bash -c "cd '$repo' && $run_block" >"$work/stdout" 2>"$work/stderr" &
pid=$!

# A first `cargo run` may compile for a few minutes; the banner is the readiness signal.
deadline=$((SECONDS + ${LANES_README_TIMEOUT:-900}))
until grep -q '^lanes serve is ready\.' "$work/stdout"; do
    if ! kill -0 "$pid" 2>/dev/null; then
        tail -30 "$work/stderr" >&2
        die "'$run_block' exited before its ready banner"
    fi
    [ "$SECONDS" -lt "$deadline" ] || { tail -30 "$work/stderr" >&2; die "no ready banner"; }
    sleep 0.5
done
until grep -q '^Check with' "$work/stdout"; do
    [ "$SECONDS" -lt "$deadline" ] || die "banner incomplete"
    sleep 0.1
done
# Only loopback exists in the namespace: the banner names it as the one path.
grep -q -- '-p 127.0.0.1:3260 --login' "$work/stdout" \
    || { cat "$work/stdout" >&2; die "banner has no login to 127.0.0.1:3260"; }
grep -q 'vendor "LANES"' "$work/stdout" || die "banner has no multipath.conf device section"
[ -f "$repo/lanes-data/disk0.img" ] || die "no ./lanes-data/disk0.img"
size=$(stat -c %s "$repo/lanes-data/disk0.img")
[ "$size" = $((1024 * 1024 * 1024)) ] || die "disk0.img is $size bytes, expected 1 GiB"

kill -INT -- "-$pid"
deadline=$((SECONDS + 30))
while kill -0 "$pid" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || die "still running 30 s after SIGINT"
    sleep 0.1
done
status=0
wait "$pid" || status=$?
pid=""
[ "$status" = 0 ] || { tail -20 "$work/stderr" >&2; die "exit status $status after SIGINT"; }
grep -qi 'panick' "$work/stderr" && die "it panicked: $(grep -i panick "$work/stderr")"
echo "readme-check: '$run_block' printed its banner (1 GiB disk0.img, login to 127.0.0.1:3260) and exited 0 on SIGINT"
