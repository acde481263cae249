#!/usr/bin/env bash
# Checks the Debian package: it builds (scripts/build-deb.sh); it holds the binary, both units,
# the conffile, the man pages and the completions; systemd-analyze verify accepts both units in
# the extracted tree and rates lanes.service's exposure at 3.0 or below; every man page renders
# without a groff warning; and the extracted binary starts from the packaged configuration
# (paths moved to a temp dir, a loopback portal), tells NOTIFY_SOCKET READY=1, ignores SIGHUP and
# stops cleanly on SIGTERM, and lanes attach of its LUN (FUSE and NBD exports, with the attach
# unit's capabilities) does the same.
#
# Needs root, /dev/fuse, dpkg-deb (dpkg), systemd-analyze (systemd), man (man-db), groff
# (groff-base), python3, lintian and setpriv (util-linux); scripts/test.sh installs them.
# Never installs the package and never starts a unit: it works where PID 1 is not systemd.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
    echo "package-check: FAIL: $*" >&2
    exit 1
}
ok() { echo "package-check: $*"; }

for tool in dpkg-deb systemd-analyze man groff python3 lintian setpriv; do
    command -v "$tool" >/dev/null || fail "$tool is missing (packages: dpkg systemd man-db groff-base python3)"
done

deb=$(scripts/build-deb.sh | tail -n 1)
[ -f "$deb" ] || fail "scripts/build-deb.sh printed no .deb ($deb)"
ok "built $deb"

work=$(mktemp -d)
# A failed attach check may leave its FUSE mount behind: unmount before removing.
trap 'umount -l "$work/fuse" 2>/dev/null || true; rm -rf "$work"' EXIT

# --- contents -------------------------------------------------------------------------------------
dpkg-deb -c "$deb" | awk '{print $NF}' | sed 's#^\./#/#' >"$work/contents"
expected=(
    /usr/bin/lanes
    /lib/systemd/system/lanes.service
    /lib/systemd/system/lanes-attach@.service
    /etc/lanes/lanes.toml
    /usr/share/bash-completion/completions/lanes
    /usr/share/zsh/vendor-completions/_lanes
    /usr/share/fish/vendor_completions.d/lanes.fish
    /usr/share/doc/lanes/OPERATING.md
    /usr/share/man/man1/lanes.1.gz
)
for sub in serve status alua lab attach bench doctor; do
    expected+=("/usr/share/man/man1/lanes-$sub.1.gz")
done
for path in "${expected[@]}"; do
    grep -qxF "$path" "$work/contents" || fail "$deb lacks $path"
done
ok "dpkg-deb -c lists all ${#expected[@]} expected paths ($(grep -c '^/usr/share/man/man1/.*\.1\.gz$' "$work/contents") man pages)"

[ "$(dpkg-deb -f "$deb" Package)" = lanes ] || fail "control: Package is not lanes"
[ "$(dpkg-deb -f "$deb" Architecture)" = amd64 ] || fail "control: Architecture is not amd64"
# conffiles is a member of the control archive, not a field: dpkg-deb -I prints it.
conffiles=$(dpkg-deb -I "$deb" conffiles)
grep -qxF /etc/lanes/lanes.toml <<<"$conffiles" || fail "conffiles lacks /etc/lanes/lanes.toml: $conffiles"
ok "dpkg-deb -f: $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version) $(dpkg-deb -f "$deb" Architecture), Depends: $(dpkg-deb -f "$deb" Depends); conffiles: $conffiles"

# Debian policy (lintian): no error and no warning.
findings=$(lintian --allow-root "$deb" 2>&1) || fail "lintian: $findings"
[ -z "$findings" ] || fail "lintian: $findings"
ok "lintian: no errors, no warnings"

# Maintainer scripts: they must at least parse (they cannot run here: PID 1 is not systemd).
dpkg-deb -e "$deb" "$work/control"
for script in postinst prerm postrm; do
    [ -x "$work/control/$script" ] || fail "no executable $script in the control archive"
    sh -n "$work/control/$script" || fail "$script does not parse"
done
ok "maintainer scripts postinst, prerm, postrm parse"

# --- the extracted tree ---------------------------------------------------------------------------
root="$work/root"
dpkg-deb -x "$deb" "$root"
lanes="$root/usr/bin/lanes"
version=$("$lanes" --version) || fail "the packaged binary does not run"
[ "$version" = "lanes $(dpkg-deb -f "$deb" Version)" ] ||
    fail "the packaged binary says '$version' in package version $(dpkg-deb -f "$deb" Version)"
ok "the packaged binary runs: $version"

# systemd-analyze verify --root needs the units the packaged ones depend on (sysinit.target,
# network-online.target, ...) and the ExecReload binary inside that root: the host's units are
# copied in under the packaged ones (never over them). MANPATH lets it check Documentation=.
cp -rn /lib/systemd/system/. "$root/lib/systemd/system/"
mkdir -p "$root/bin" "$root/etc/lanes/attach"
cp /bin/kill "$root/bin/kill"
cp "$root/usr/share/doc/lanes/examples/attach.conf" "$root/etc/lanes/attach/check.conf"
if ! verify=$(MANPATH="$root/usr/share/man" systemd-analyze verify --root="$root" \
    lanes.service lanes-attach@check.service 2>&1) || [ -n "$verify" ]; then
    fail "systemd-analyze verify: $verify"
fi
ok "systemd-analyze verify --root accepts lanes.service and lanes-attach@check.service"
# The target's hardening must not erode: systemd's exposure score (0 best, 10 worst; 2.4 when
# this was written) stays at or below 3.0.
security=$(systemd-analyze security --offline=yes --root="$root" --threshold=30 lanes.service 2>&1) ||
    fail "lanes.service exposure is above 3.0: $(grep -F 'Overall exposure' <<<"$security")"
ok "$(grep -F 'Overall exposure' <<<"$security" | sed 's/^→ //')"

pages=0
for page in "$root"/usr/share/man/man1/*.1.gz; do
    warnings=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null) ||
        fail "man -l $page failed: $warnings"
    [ -z "$warnings" ] || fail "man -l $page: $warnings"
    pages=$((pages + 1))
done
ok "$pages man pages render with no warnings"

# The bash completion loads and registers itself for lanes (zsh and fish are not installed here).
completion=$(bash -c "source '$root/usr/share/bash-completion/completions/lanes' && complete -p lanes") ||
    fail "the bash completion does not load"
ok "bash completion: $completion"

# --- the packaged configuration, served -----------------------------------------------------------
# The conffile as shipped, with its data moved into the temp dir and its portal on loopback
# (port 0: the kernel picks a free one, the banner names it).
data="$work/var-lib-lanes"
config="$work/lanes.toml"
sed -e "s#/var/lib/lanes#$data#g" -e 's#"0\.0\.0\.0:3260"#"127.0.0.1:0"#' \
    "$root/etc/lanes/lanes.toml" >"$config"
grep -qF "$data/disk0.img" "$config" || fail "the packaged config has no LUN at /var/lib/lanes/disk0.img"
grep -qF '"127.0.0.1:0"' "$config" || fail "the packaged config has no 0.0.0.0:3260 portal to move"
# As the units run them, as far as this machine allows without systemd: umask 0077, each unit's
# capability bounding set and no_new_privs (setpriv, util-linux), when run as root, and for
# serve the unit's SystemCallFilter=. Not reproduced here: the mount namespace of
# ProtectSystem= and friends, MemoryDenyWriteExecute, RestrictAddressFamilies.
serve_command=$(printf '%q' "$lanes")
attach_command=$serve_command
[ "$(id -u)" = 0 ] || fail "run as root: the units' capability sets are reproduced with setpriv"
serve_command="setpriv --no-new-privs --bounding-set -all,+net_bind_service --inh-caps -all $serve_command"
attach_command="setpriv --no-new-privs --bounding-set -all,+sys_admin,+net_raw,+dac_override --inh-caps -all $attach_command"
ok "lanes serve runs under: umask 0077, ${serve_command% *}"
ok "lanes attach runs under: ${attach_command% *}"
# lanes serve also runs under the unit's own system call filter (libseccomp, from the unit file).
serve_filter=$(sed -n 's/^SystemCallFilter=//p' "$root/lib/systemd/system/lanes.service")
(umask 0077 && python3 scripts/package_serve_check.py "$work" "$config" "$serve_command" \
    "$attach_command" "$serve_filter")
size=$(stat -c %s "$data/disk0.img")
[ "$size" = $((1 << 30)) ] || fail "disk0.img is $size bytes, expected 1 GiB"
ok "the packaged config created $data/disk0.img (1 GiB, $(du -k "$data/disk0.img" | cut -f1) KiB allocated)"
echo "package-check: all checks passed"
