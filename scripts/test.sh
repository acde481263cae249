#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit/integration tests, interop with real iSCSI
# peers, and a short fuzz smoke. Installs what it needs on Debian 12.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> [%4ds] %s\n' "$SECONDS" "$*"; }

# --- Debian packages ------------------------------------------------------------------------------
# scripts/packages.txt maps every program the tests call to its package. A package is installed
# when its program is missing, whatever else the image already has; QEMU's iSCSI driver is checked
# by what it does (qemu-img opening an iscsi:// image), not by qemu-img being there, because a
# qemu-utils from backports next to the distribution's qemu-block-extra cannot load it.
export PATH="$PATH:/usr/sbin:/sbin"
sudo_cmd=""
if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
apt_get() { $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get "$@"; }

package_lines() { grep -vE '^[[:space:]]*(#|$)' scripts/packages.txt; }
missing_packages() {
    local program package
    while read -r program package; do
        if [ "$program" = - ]; then
            [ "$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null)" = installed ] \
                || echo "$package"
        elif ! command -v "$program" >/dev/null 2>&1; then
            echo "$package"
        fi
    done < <(package_lines) | sort -u
}
# QEMU's libiscsi driver loads only when qemu-block-extra is the same build as qemu-img.
qemu_has_iscsi() {
    local out
    out=$(timeout 30 qemu-img info --image-opts \
        "driver=iscsi,transport=tcp,portal=127.0.0.1:1,target=iqn.2026-11.io.lanes.test:probe,lun=0" 2>&1) || true
    ! grep -qiE "unknown driver|unable to load module" <<<"$out"
}
# Both QEMU packages at one version: qemu-utils' own when qemu-block-extra exists at it, else
# the version apt would pick for qemu-block-extra (downgrading a newer qemu-utils to it).
install_qemu_pair() {
    local have version
    have=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
    if [ -n "$have" ] && apt-cache madison qemu-block-extra | awk -F'|' '{gsub(/ /,"",$2); print $2}' \
        | grep -qxF "$have"; then
        version=$have
    else
        version=$(apt-cache policy qemu-block-extra | awk '/Candidate:/ {print $2}')
    fi
    [ -n "$version" ] && [ "$version" != "(none)" ] || { echo "no installable qemu-block-extra" >&2; return 1; }
    step "installing qemu-utils and qemu-block-extra $version"
    apt_get install -y --no-install-recommends --allow-downgrades \
        "qemu-utils=$version" "qemu-block-extra=$version"
}

mapfile -t missing < <(missing_packages)
qemu_ok=1
command -v qemu-img >/dev/null 2>&1 && qemu_has_iscsi || qemu_ok=0
if [ "${#missing[@]}" -gt 0 ] || [ "$qemu_ok" = 0 ]; then
    step "installing Debian packages: ${missing[*]:-} $([ "$qemu_ok" = 0 ] && echo '(QEMU iSCSI driver)')"
    # Package scripts must not start daemons (multipathd, tgtd) on the machine running the tests.
    policy_rc=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        policy_rc=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee "$policy_rc" >/dev/null
        $sudo_cmd chmod 755 "$policy_rc"
    fi
    apt_get update
    others=()
    for package in "${missing[@]}"; do
        case "$package" in qemu-utils | qemu-block-extra) ;; *) others+=("$package") ;; esac
    done
    if [ "${#others[@]}" -gt 0 ]; then
        apt_get install -y --no-install-recommends "${others[@]}"
    fi
    if ! command -v qemu-img >/dev/null 2>&1 || ! qemu_has_iscsi; then
        install_qemu_pair
    fi
    if [ -n "$policy_rc" ]; then $sudo_cmd rm -f "$policy_rc"; fi
fi
mapfile -t still_missing < <(missing_packages)
if [ "${#still_missing[@]}" -gt 0 ]; then
    echo "test.sh: still missing after installation: ${still_missing[*]}" >&2
    exit 1
fi
qemu_has_iscsi || { echo "test.sh: qemu-img cannot load its iSCSI driver (qemu-block-extra)" >&2; exit 1; }

# --- cargo-nextest -------------------------------------------------------------------------------
if ! cargo nextest --version >/dev/null 2>&1; then
    step "installing cargo-nextest"
    cargo install --locked cargo-nextest || echo "cargo-nextest could not be installed; using cargo test"
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "tests"
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --release --no-fail-fast
    # nextest does not run doctests.
    cargo test --workspace --release --doc
else
    cargo test --workspace --release
fi

# --- the README's first command, verbatim -------------------------------------------------------
step "README quick start (scripts/readme-check.sh)"
scripts/readme-check.sh

# --- the Debian package and its units ------------------------------------------------------------
step "Debian package (scripts/package-check.sh)"
scripts/package-check.sh

# --- a real Linux host: Debian's kernel in QEMU against lanes serve --------------------------------
step "real Linux host (vm/tests: seed-000, alua, attach-nbd, persistent-reservations, lio-peer, cifs-multichannel)"
vm/run-test vm/tests/seed-000
vm/run-test vm/tests/alua
vm/run-test vm/tests/attach-nbd
vm/run-test vm/tests/persistent-reservations
vm/run-test vm/tests/lio-peer
vm/run-test vm/tests/cifs-multichannel

# --- interop with real peers ---------------------------------------------------------------------
step "interop (scripts/interop.sh)"
scripts/interop.sh
interop="ran"

# --- libiscsi through an HA pair: two lanes serve nodes and etcd on loopback ---------------------
step "pair conformance (scripts/pair-conformance.sh, floor in tests/conformance/pair-floor)"
cargo build --release -q -p lanes
scripts/pair-conformance.sh

# libiscsi across two RBD gateways (scripts/rbd-conformance.sh, floor in
# tests/conformance/rbd-floor) runs among the tests above, as crates/lanes/tests/rbd_conformance.rs,
# beside the RBD fault campaign.

# --- SMB: smbtorture against lanes serve, in a network namespace ----------------------------------
step "smbtorture (scripts/smbtorture.sh, floor in scripts/smbtorture-floor.txt)"
cargo build --release -q -p lanes
$sudo_cmd env "PATH=$PATH" LANES_BIN=target/release/lanes scripts/smbtorture.sh

# --- fuzz smoke ---------------------------------------------------------------------------------
# cargo-fuzz needs nightly-only compiler flags; on a stable-only machine RUSTC_BOOTSTRAP lets the
# stable compiler accept them for this build alone.
step "fuzz smoke (${FUZZ_SECONDS:-10} s per target)"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi
for target in $(cd fuzz && cargo fuzz list); do
    RUSTC_BOOTSTRAP=1 cargo +stable fuzz run "$target" -- \
        -max_total_time="${FUZZ_SECONDS:-10}" -rss_limit_mb=2048 >"/tmp/lanes-fuzz-$target.log" 2>&1 || {
        tail -40 "/tmp/lanes-fuzz-$target.log"; echo "fuzz target $target failed"; exit 1; }
    grep -E '^Done [0-9]+ runs' "/tmp/lanes-fuzz-$target.log" | sed "s/^/fuzz $target: /"
done
fuzz="ran"

echo
echo "test.sh: fmt, clippy and tests passed; interop ${interop}; fuzz smoke ${fuzz}"
