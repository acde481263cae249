#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit/integration tests, interop with real iSCSI
# peers, and a short fuzz smoke. Installs what it needs on Debian 12.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# --- Debian packages (only when one of their binaries is missing) ------------------------------
need_packages=0
for binary in iscsi-inq tgtd qemu-img fio ip iperf3 nft losetup mkfs.ext4 e2fsck; do
    command -v "$binary" >/dev/null 2>&1 || need_packages=1
done
# lanes bench's PNG charts draw their text with this font (read at run time).
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_packages=1
if [ "$need_packages" = 1 ]; then
    step "installing Debian packages"
    sudo_cmd=""
    if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
    $sudo_cmd apt-get update
    # qemu-utils and qemu-block-extra in one call so their versions match.
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y --no-install-recommends \
        libiscsi-bin tgt qemu-utils qemu-block-extra fio iproute2 iperf3 nftables fonts-dejavu-core \
        mount e2fsprogs
fi

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

# --- interop with real peers ---------------------------------------------------------------------
step "interop (scripts/interop.sh)"
scripts/interop.sh
interop="ran"

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
