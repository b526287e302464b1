#!/usr/bin/env bash
# Installs everything the scopefs test suite needs on a Debian 12 host.
#
# Idempotent: packages and tools that are already present are left alone, so a
# second run does no network work. Must run as root (FUSE mounts, Docker and
# apt all need it). Every failure exits non-zero with a message saying what is
# missing.
#
# Installs:
#   - Debian packages: fuse3, docker.io, s3fs, rclone, bindfs, fio, busybox-static,
#     sqlite3, git, build-essential, pkg-config, ca-certificates, procps,
#     psmisc, util-linux, tar, jq, shellcheck
#   - the tools of the real-tool suite (tests/real_tools.rs): python3, python3-venv,
#     python3-pip, attr (setfattr/getfattr), make and gcc (build-essential),
#     flock and fallocate (util-linux), git, sqlite3, diffutils, findutils
#   - cargo tools: pjdfstest (POSIX conformance), fsx (file-system exerciser),
#     cargo-deb (Debian package build, scripts/package-test.sh)
#   - systemd (systemd-analyze, systemd-tmpfiles: unit checks of the package test)
#   - python3-prometheus-client (a real Prometheus text parser for the /metrics test)
#   - python3-httpx, python3-pytest, python3-setuptools, python3-wheel, python3-mypy: the Python
#     client (clients/python) is pip-installed into a venv without network, type-checked, and its
#     pytest suite and examples/smoke.py run against a live daemon (tests/clients_python.rs)
#   - chromium and fonts-liberation, fonts-dejavu-core (fonts it renders text with): the admin
#     page test (tests/admin_ui.rs) drives headless Chromium over the DevTools protocol
#   - the unprivileged user `tests` that pjdfstest switches to
# Garage (the S3 server used by the tests) is installed by scripts/garage.sh.
set -euo pipefail

die() {
    echo "install-deps: ERROR: $*" >&2
    exit 1
}
say() { echo "install-deps: $*"; }

[ "$(id -u)" -eq 0 ] || die "must run as root (FUSE mounts, dockerd and apt need it)"

# --- Rust toolchain -----------------------------------------------------------
export PATH="$HOME/.cargo/bin:$PATH"
command -v cargo >/dev/null 2>&1 ||
    die "cargo not found: install a Rust toolchain (>= 1.94) with rustup first"
if command -v rustup >/dev/null 2>&1; then
    for comp in rustfmt clippy; do
        if ! rustup component list --installed 2>/dev/null | grep "^${comp}" >/dev/null; then
            say "adding rustup component ${comp}"
            rustup component add "${comp}" || die "rustup component add ${comp} failed"
        fi
    done
fi
command -v rustfmt >/dev/null 2>&1 || die "rustfmt not found (rustup component add rustfmt)"
cargo clippy --version >/dev/null 2>&1 || die "cargo clippy not found (rustup component add clippy)"

# --- Debian packages ----------------------------------------------------------
PACKAGES=(
    fuse3 docker.io s3fs rclone bindfs fio busybox-static sqlite3 git
    build-essential pkg-config ca-certificates procps psmisc util-linux tar jq
    systemd python3-prometheus-client shellcheck
    python3 python3-venv python3-pip attr make gcc diffutils findutils coreutils
    python3-httpx python3-pytest python3-setuptools python3-wheel python3-mypy
    chromium fonts-liberation fonts-dejavu-core
)
missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; missing packages: ${missing[*]}"
    say "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q || die "apt-get update failed"
    apt-get install -y -q --no-install-recommends "${missing[@]}" ||
        die "apt-get install failed for: ${missing[*]}"
else
    say "Debian packages present"
fi
for bin in fusermount3 docker dockerd s3fs rclone bindfs fio busybox sqlite3 git jq systemd-analyze shellcheck chromium; do
    command -v "$bin" >/dev/null 2>&1 || die "'$bin' not on PATH after installing packages"
done
# The real-tool suite (tests/real_tools.rs) runs these, and Debian's python3, as an
# unprivileged user (not a root-only pyenv).
for bin in setfattr getfattr flock fallocate make cc tar diff find timeout; do
    command -v "$bin" >/dev/null 2>&1 || die "'$bin' (real-tool suite) not on PATH after installing packages"
done
/usr/bin/python3 -c 'import venv, ensurepip, sqlite3, mmap, fcntl, zipfile' 2>/dev/null ||
    die "/usr/bin/python3 lacks venv/ensurepip/sqlite3 (apt-get install python3-venv python3-pip)"
/usr/bin/python3 -c 'import httpx, pytest, setuptools, wheel, mypy' 2>/dev/null ||
    die "/usr/bin/python3 lacks httpx/pytest/setuptools/wheel/mypy (apt-get install python3-httpx python3-pytest python3-setuptools python3-wheel python3-mypy)"
[ -c /dev/fuse ] || die "/dev/fuse is missing: load the fuse module (modprobe fuse) or run the container with --device /dev/fuse"

# --- cargo-installed test tools -------------------------------------------------
for tool in pjdfstest fsx cargo-deb; do
    if [ -x "$HOME/.cargo/bin/$tool" ] || command -v "$tool" >/dev/null 2>&1; then
        say "$tool present"
    else
        say "cargo install --locked $tool"
        cargo install --locked "$tool" || die "cargo install $tool failed"
    fi
done

# --- the dummy user pjdfstest switches to ---------------------------------------
if ! id tests >/dev/null 2>&1; then
    say "creating user 'tests' for pjdfstest"
    echo 'tests:x:::Dummy:/:/usr/sbin/nologin' | newusers -r || die "could not create user 'tests'"
fi

say "ok"
