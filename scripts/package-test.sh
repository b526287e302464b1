#!/usr/bin/env bash
# Acceptance a of issue 6: builds the Debian package with cargo-deb, installs it
# with dpkg, checks the installed files and lets systemd-analyze verify the unit.
#
#   bash scripts/package-test.sh
#
# Needs root (dpkg -i) and cargo-deb (scripts/install-deps.sh installs it).
# The installed package stays installed (the service is neither enabled nor
# started: this is a build/install check, not a deployment).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
export PATH="$HOME/.cargo/bin:$PATH"

die() {
    echo "package-test: FAIL: $*" >&2
    exit 1
}
say() { echo "package-test: $*"; }

[ "$(id -u)" -eq 0 ] || die "must run as root (dpkg -i)"
command -v cargo-deb >/dev/null 2>&1 || die "cargo-deb not found (scripts/install-deps.sh installs it)"
command -v systemd-analyze >/dev/null 2>&1 || die "systemd-analyze not found (Debian package systemd)"
command -v readelf >/dev/null 2>&1 || die "readelf not found (Debian package binutils)"

# The release profile keeps line tables for profiling; the package ships a stripped binary.
say "cargo deb --strip -p scopefs-daemon"
DEB_LOG=$(mktemp)
trap 'rm -f "$DEB_LOG"' EXIT
# Output goes to a file first (no /dev/stderr: it is missing in some sandboxes).
if ! cargo deb --locked --strip -p scopefs-daemon >"$DEB_LOG" 2>&1; then
    tail -n 80 "$DEB_LOG" >&2
    die "cargo deb failed (its last lines are above)"
fi
grep -v '^ *Compiling ' "$DEB_LOG" || true
DEB=$(grep -E '\.deb$' "$DEB_LOG" | tail -n1)
if [ -z "$DEB" ] || [ ! -f "$DEB" ]; then die "cargo deb did not report a .deb file"; fi
say "built $DEB ($(du -h "$DEB" | cut -f1))"

# The shipped default configuration must be accepted by the daemon's own parser (the release build
# cargo deb just made: no second build of the daemon with other features).
say "checking packaging/scopefs.toml with the daemon's config parser"
target/release/scopefs --config packaging/scopefs.toml serve --print-config >/dev/null ||
    die "packaging/scopefs.toml is refused by scopefs"

say "package contents"
dpkg-deb -c "$DEB"
dpkg-deb -I "$DEB" | grep 'Package: scopefs' >/dev/null || die "package is not named scopefs"

say "dpkg -i"
# --force-confold: a reinstall over an operator-edited config keeps theirs (and never prompts).
DEBIAN_FRONTEND=noninteractive dpkg -i --force-confold "$DEB" </dev/null || die "dpkg -i failed"

for f in /usr/bin/scopefs /lib/systemd/system/scopefs.service /usr/lib/tmpfiles.d/scopefs.conf \
    /etc/scopefs/scopefs.toml /usr/share/doc/scopefs/README.md /usr/share/doc/scopefs/SEMANTICS.md; do
    [ -f "$f" ] || die "$f was not installed"
    say "installed $f"
done
dpkg-query -W -f='${Conffiles}\n' scopefs | grep '/etc/scopefs/scopefs.toml' >/dev/null ||
    die "/etc/scopefs/scopefs.toml is not a conffile"
cmp -s packaging/scopefs.toml /etc/scopefs/scopefs.toml || die "installed config differs from packaging/scopefs.toml"
/usr/bin/scopefs --version || die "installed binary does not run"
sections=$(readelf -S /usr/bin/scopefs) || die "readelf cannot read the installed binary"
if grep -q -E '\.(debug_info|debug_line|symtab)( |$)' <<<"$sections"; then
    die "the packaged binary still carries debug sections (cargo deb --strip)"
fi
say "installed binary is stripped ($(du -h /usr/bin/scopefs | cut -f1))"
# The installed binary reads the installed default config (no --config: /etc/scopefs/scopefs.toml).
env -u SCOPEFS_CONFIG /usr/bin/scopefs serve --print-config | grep '^mount_root = "/run/scopefs/scopes"$' >/dev/null ||
    die "installed binary does not accept the installed config"

# Acceptance d of issue 11: the release binary ignores the test hooks (SCOPEFS_FAILPOINT at a
# failpoint a provision reaches, SCOPEFS_TEST_CLOCK_FILE ten years ahead). The test binary is the
# one `cargo test --workspace --no-run` built (scripts/test.sh step 6): same features, no rebuild.
say "the installed release binary ignores SCOPEFS_FAILPOINT and SCOPEFS_TEST_CLOCK_FILE"
SCOPEFS_RELEASE_BIN=/usr/bin/scopefs cargo test --locked --workspace --test release_hooks -- \
    --ignored --exact release_binary_ignores_test_hooks ||
    die "the release binary honours a test hook (see the test output above)"

say "systemd-analyze verify"
# verify needs the unit's ExecStart binary to exist (it does now) and checks every directive.
out=$(systemd-analyze verify /lib/systemd/system/scopefs.service 2>&1) || {
    echo "$out" >&2
    die "systemd-analyze verify rejected the unit"
}
# verify also prints warnings for other units on the machine; any line about ours fails the step.
if grep -i 'scopefs' <<<"$out"; then
    die "systemd-analyze verify reported problems with scopefs.service"
fi
# Applying the tmpfiles entry creates the runtime and state directories (idempotent).
systemd-tmpfiles --create /usr/lib/tmpfiles.d/scopefs.conf || die "systemd-tmpfiles rejected scopefs.conf"
[ -d /run/scopefs/scopes ] || die "tmpfiles did not create /run/scopefs/scopes"
say "ok"
