# Shared by the real-host tests in vm/tests: a network namespace with TAP links, `lanes serve`
# in it, the banner's host commands and configuration, a guest prologue that starts what a
# Debian host runs (udevd, iscsid, multipathd) and logs in exactly as the banner says, and the
# guest's console with host-side actions on `LANES-VM-EVENT` lines. Source it; set `name`
# (a short test name) first. Root only; traffic stays inside the namespace it creates.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lanes=${LANES_BIN:-$repo/target/release/lanes}
ns="lanes-vm$name-$$"
work=$(mktemp -d "/tmp/lanes-vm$name.XXXXXX")
serve_pid=""
die() { echo "$name: FAIL: $*" >&2; exit 1; }
# What the host side saw, printed when a test fails: the end of lanes' log, the links' packet
# and drop counters, and the namespace's TCP retransmission and timeout counters.
vm_diagnose() {
    echo "$name: lanes serve log (last 30 lines):"
    tail -n 30 "$work/serve.log" 2>/dev/null | sed 's/^/  /'
    ip -n "$ns" -s link show 2>/dev/null | sed 's/^/  /'
    ip netns exec "$ns" nstat -az 2>/dev/null \
        | grep -E '^(TcpRetransSegs|TcpExtTCPTimeouts|TcpExtTCPLossProbes|TcpExtTCPSackRecovery) ' \
        | sed 's/^/  /'
}
vm_cleanup() {
    local status=$?
    [ "$status" = 0 ] || [ ! -d "$work" ] || vm_diagnose >&2 || true
    # LANES_VM_KEEP=DIR keeps lanes' whole log (DIR/NAME-serve.log).
    [ -z "${LANES_VM_KEEP:-}" ] || cp "$work/serve.log" "$LANES_VM_KEEP/$name-serve.log" 2>/dev/null || true
    [ -z "$serve_pid" ] || kill "$serve_pid" 2>/dev/null || true
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip netns delete "$ns" 2>/dev/null || true
    rm -rf "$work"
    exit "$status"
}
trap vm_cleanup EXIT INT TERM

# In the test and in the guest (which runs this machine's own programs).
for tool in iscsiadm iscsid multipath multipathd udevadm mkfs.ext4 e2fsck fio md5sum dd python3 lsscsi; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found (scripts/test.sh installs it)"
done
[ -x /lib/systemd/systemd-udevd ] || die "no systemd-udevd (package udev)"

# vm_links SUBNET_BYTE N: N TAP links tapI with 10.SUBNET.I.1/24 on the namespace side.
vm_links() {
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    for i in $(seq "$2"); do
        ip -n "$ns" tuntap add dev "tap$i" mode tap
        ip -n "$ns" addr add "10.$1.$i.1/24" dev "tap$i"
        ip -n "$ns" link set "tap$i" up
    done
}

# vm_serve ARGS...: lanes serve in the namespace; waits for its whole banner.
vm_serve() {
    ip netns exec "$ns" "$lanes" serve "$@" >"$work/banner" 2>"$work/serve.log" &
    serve_pid=$!
    for _ in $(seq 600); do grep -q '^Check with' "$work/banner" && break; sleep 0.1; done
    grep -q '^Check with' "$work/banner" || die "no banner from lanes serve: $(tail -5 "$work/serve.log")"
}

# The banner's sections, indentation removed.
vm_section() {
    awk -v head="$1" '
        index($0, head) == 1 { inside = 1; next }
        inside && /^[^ ]/ { exit }
        inside { sub(/^  /, ""); print }' "$work/banner"
}

# Writes the banner's host commands (minus package installation and systemctl: the guest has no
# systemd; `systemctl reload multipathd` becomes `multipathd reconfigure`), its multipath.conf
# and fstab line (ext4 for the suggested XFS) to $work, and sets $alias.
vm_host_config() {
    vm_section "On a Linux host" | grep -vE '^(#|apt-get|dnf|$)' \
        | sed 's/^systemctl reload multipathd$/multipathd reconfigure/' | grep -v '^systemctl' \
        >"$work/commands"
    vm_section "/etc/multipath.conf" >"$work/multipath.conf"
    vm_section "/etc/fstab:" | grep -v '^$' | sed 's/  xfs  /  ext4  /' >"$work/fstab"
    alias=$(awk '$1 == "alias" {print $2; exit}' "$work/multipath.conf")
    [ -n "$alias" ] || die "no alias in the banner's multipath.conf"
}

# The guest script's first part: helpers, daemons, the banner's commands, two active paths.
vm_guest_prologue() {
    cat <<GUEST
set -uo pipefail
work=$work
alias=$alias
fail() { echo "guest: FAIL: \$*"; multipath -ll; exit 1; }
paths_active() { [ "\$(multipath -ll "\$alias" 2>/dev/null | grep -c 'active ready running')" = 2 ]; }
wait_for() { local n=\$1; shift; for _ in \$(seq "\$n"); do "\$@" && return 0; sleep 0.5; done; return 1; }
event() { echo "LANES-VM-EVENT \$*"; wait_for 60 test -e "\$work/done-\$1" || fail "host did not do \$*"; }

/lib/systemd/systemd-udevd --daemon >/dev/null 2>&1
udevadm trigger && udevadm settle -t 10
cp "\$work/multipath.conf" /etc/multipath.conf
iscsid -f >/dev/null 2>&1 &
multipathd -d >"\$work/multipathd.log" 2>&1 &
wait_for 20 multipathd show paths >/dev/null || true
while read -r line; do
    echo "+ \$line"
    bash -c "\$line" || fail "\$line"
done <"\$work/commands"
udevadm settle -t 10
wait_for 60 paths_active || fail "two active paths"
multipath -ll "\$alias" | tee "\$work/multipath-ll"
grep -q "LANES" "\$work/multipath-ll" || fail "vendor LANES"
grep -q "hwhandler='1 alua'" "\$work/multipath-ll" || fail "ALUA handler"
GUEST
}

# vm_run ACTION NICS...: boots the guest on $work/guest.sh with the given --nic specs; for each
# console line `LANES-VM-EVENT WORD ARGS...` it runs `ACTION WORD ARGS...` and then creates
# $work/done-WORD (the guest's `event` waits for it).
vm_run() {
    local action=$1 nic_args=() status=0
    shift
    for nic in "$@"; do nic_args+=(--nic "$nic"); done
    "$repo/vm/boot" --netns "$ns" "${nic_args[@]}" --share "$work" --qmp "$work/qmp.sock" \
        --memory 1536 --timeout 600 "$work/guest.sh" 2>&1 \
        | while IFS= read -r line; do
            printf '%s\n' "$line"
            case "$line" in
                *"NETDEV WATCHDOG"*)
                    # The guest's emulated NIC stopped transmitting (seen once in QEMU's
                    # software emulation, a transmit queue stuck for minutes while lanes' side
                    # counted no TCP timeout): nothing after this measures lanes. End the guest
                    # now; vm/run-test runs the test again, once.
                    if [ ! -e "$work/nic-hung" ]; then
                        touch "$work/nic-hung"
                        "$repo/vm/qmp" "$work/qmp.sock" quit >/dev/null 2>&1 || true
                    fi
                    ;;
                "LANES-VM-EVENT "*)
                    read -r -a words <<<"${line#LANES-VM-EVENT }"
                    "$action" "${words[@]}" || echo "$name: host action ${words[*]} failed"
                    touch "$work/done-${words[0]}"
                    ;;
            esac
        done || status=$?
    if [ -e "$work/nic-hung" ]; then
        echo "$name: EMULATOR FAULT: the guest's emulated NIC stopped transmitting (NETDEV WATCHDOG); this run measures nothing of lanes" >&2
        exit 75
    fi
    [ "$status" = 0 ] || die "guest exited $status"
}
