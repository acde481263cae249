#!/usr/bin/env bash
# Builds the Debian package target/debian/lanes_<version>_amd64.deb: the release binary, then
# its man pages and shell completions generated from the CLI (lanes generate, into
# target/release/generated, where crates/lanes/Cargo.toml's [package.metadata.deb] assets point),
# then cargo deb. Installs cargo-deb when it is missing. Prints the .deb's path last.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo deb --version >/dev/null 2>&1; then
    echo "build-deb: installing cargo-deb" >&2
    cargo install --locked cargo-deb >&2
fi

metadata=$(cargo metadata --format-version 1 --no-deps)
field() { python3 -c "import json,sys; m=json.load(sys.stdin); print($1)" <<<"$metadata"; }
target_dir=$(field 'm["target_directory"]')
lanes_package='next(p for p in m["packages"] if p["name"]=="lanes")'
version=$(field "${lanes_package}[\"version\"]")
maintainer=$(field "${lanes_package}[\"metadata\"][\"deb\"][\"maintainer\"]")

cargo build --release -p lanes >&2
generated="$target_dir/release/generated"
rm -rf "$generated"
"$target_dir/release/lanes" generate man "$generated/man" >/dev/null
# Compressed here: cargo-deb leaves files from target/release/ as they are.
gzip -9 -n "$generated"/man/*.1
"$target_dir/release/lanes" generate completions "$generated/completions" >/dev/null

# A native package needs a Debian changelog: one entry for this version, dated by the commit
# it is built from (the same tree gives the same package).
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
date=$(git log -1 --format=%aD 2>/dev/null || date -R)
cat >"$generated/changelog" <<CHANGELOG
lanes ($version) unstable; urgency=medium

  * lanes $version, built from commit $commit.

 -- $maintainer  $date
CHANGELOG
gzip -9 -n "$generated/changelog"

# --no-build: the binary above is the one the pages were generated from. --strip: the release
# profile keeps line tables for profiling; the package does not need them (72 MB -> 9 MB).
cargo deb -p lanes --no-build --strip --output "$target_dir/debian/" >&2
deb="$target_dir/debian/lanes_${version}_amd64.deb"
[ -f "$deb" ] || { echo "build-deb: cargo deb did not write $deb" >&2; exit 1; }
echo "$deb"
