#!/usr/bin/env bash
# Builds a scopefs sandbox image without any image registry.
#
#   build-offline.sh [--tag NAME:TAG] [--force] [--python] [--full [--mirror URL]]
#
# Default (minimal): a rootfs holding Debian's static busybox and a symlink
# for every applet, an `agent` user (uid 2000000000, the default executor.user; no host account has it) and /workspace, imported with
# `docker import`. Needs only the busybox-static package and a Docker engine.
#
# --python: the minimal image plus the host's Debian python3 (/usr/bin/python3.11,
# its standard library without tests, and the shared libraries both need), as
# `python3` and `python`: enough for the seed's smoke test (`python --version`,
# reading and writing files) without any package download.
#
# --full: a Debian 12 minbase rootfs with python3, git and coreutils built by
# debootstrap (must be installed; it fetches packages from the configured
# Debian mirror, or --mirror URL), with the same `agent` user.
#
# The image is skipped when it already exists unless --force is given.
# Progress goes to stderr; the image tag is printed on stdout.
set -euo pipefail

die() {
    echo "build-offline: ERROR: $*" >&2
    exit 1
}
say() { echo "build-offline: $*" >&2; }

TAG=""
FORCE=0
FULL=0
PYTHON=0
MIRROR=""
while [ $# -gt 0 ]; do
    case "$1" in
    --tag) TAG="${2:?--tag needs a value}"; shift 2 ;;
    --force) FORCE=1; shift ;;
    --full) FULL=1; shift ;;
    --python) PYTHON=1; shift ;;
    --mirror) MIRROR="${2:?--mirror needs a value}"; shift 2 ;;
    -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1" ;;
    esac
done
if [ -z "$TAG" ]; then
    if [ "$FULL" -eq 1 ]; then TAG="scopefs-sandbox:debian12"; else TAG="scopefs-sandbox:busybox"; fi
fi

command -v docker >/dev/null 2>&1 || die "docker CLI not found"
docker version >/dev/null 2>&1 || die "Docker engine not answering (start dockerd first)"

if [ "$FORCE" -eq 0 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
    say "image $TAG exists (use --force to rebuild)"
    echo "$TAG"
    exit 0
fi

# Copies path $2 into rootfs $1 at the same place (symlinks kept as symlinks, their targets too).
copy_into() {
    local root=$1 path=$2
    [ -e "$root$path" ] && return 0
    mkdir -p "$root$(dirname "$path")"
    cp -a "$path" "$root$path"
    if [ -L "$path" ]; then
        # Its target as the link names it (one level), so the link resolves inside the rootfs too.
        local target
        target=$(readlink "$path")
        case "$target" in
        /*) ;;
        *) target="$(dirname "$path")/$target" ;;
        esac
        copy_into "$root" "$target"
    fi
}

# The shared libraries (with their loader) that the ELF files given need, into rootfs $1.
copy_libraries() {
    local root=$1
    shift
    local lib
    # ldd names each file given ("path:") and then, per library, "name => /path (address)".
    for lib in $(LC_ALL=C ldd "$@" 2>/dev/null | grep -v ':$' | grep -o '/[^ ]*' | sort -u); do
        if [ -e "$lib" ]; then
            copy_into "$root" "$lib"
        fi
    done
}

# The host's Debian python3 into rootfs $1 (--python).
add_host_python() {
    local root=$1 python=/usr/bin/python3.11 stdlib=/usr/lib/python3.11
    if [ ! -x "$python" ] || [ ! -d "$stdlib" ]; then
        die "--python needs Debian's python3.11 (apt-get install python3)"
    fi
    copy_into "$root" "$python"
    mkdir -p "$root$stdlib"
    tar -C "$stdlib" --exclude=test --exclude=tests --exclude=idlelib --exclude=tkinter \
        --exclude=ensurepip --exclude=__pycache__ -cf - . | tar -C "$root$stdlib" -xf - ||
        die "copying the python standard library failed"
    copy_libraries "$root" "$python" "$stdlib"/lib-dynload/*.so
    ln -sf python3.11 "$root/usr/bin/python3"
    ln -sf python3.11 "$root/usr/bin/python"
}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ROOT="$WORK/root"
mkdir -p "$ROOT"

IMPORT_CHANGES=(--change 'WORKDIR /workspace')

if [ "$FULL" -eq 0 ]; then
    BUSYBOX=/bin/busybox
    [ -x "$BUSYBOX" ] || die "$BUSYBOX not found (apt-get install busybox-static)"
    file_out=$(LC_ALL=C ldd "$BUSYBOX" 2>&1 || true)
    case "$file_out" in
    *"not a dynamic executable"* | *"statically linked"*) ;;
    *) die "$BUSYBOX is dynamically linked; install the busybox-static package" ;;
    esac
    mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,root,home/agent,workspace}
    cp "$BUSYBOX" "$ROOT/bin/busybox"
    for applet in $("$BUSYBOX" --list); do
        [ "$applet" = busybox ] && continue
        ln -sf busybox "$ROOT/bin/$applet"
    done
    ln -sf ../../bin/env "$ROOT/usr/bin/env"
    cat >"$ROOT/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
agent:x:2000000000:2000000000:agent:/home/agent:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
    cat >"$ROOT/etc/group" <<'GROUP'
root:x:0:
agent:x:2000000000:
nogroup:x:65534:
GROUP
    chmod 1777 "$ROOT/tmp"
    chmod 0700 "$ROOT/root"
    chown 2000000000:2000000000 "$ROOT/home/agent" "$ROOT/workspace"
    IMPORT_CHANGES+=(--change 'ENV PATH=/bin:/sbin:/usr/bin:/usr/sbin' --change 'CMD ["/bin/sh"]')
    [ "$PYTHON" -eq 0 ] || add_host_python "$ROOT"
else
    command -v debootstrap >/dev/null 2>&1 || die "--full needs debootstrap (apt-get install debootstrap)"
    say "debootstrap bookworm (minbase + python3, git) — this takes a few minutes"
    # shellcheck disable=SC2086
    debootstrap --variant=minbase --include=python3,git,ca-certificates bookworm "$ROOT" $MIRROR >&2 ||
        die "debootstrap failed"
    chroot "$ROOT" /usr/sbin/useradd -l -u 2000000000 -U -m -s /bin/bash agent || die "useradd agent failed"
    mkdir -p "$ROOT/workspace"
    chown 2000000000:2000000000 "$ROOT/workspace"
    rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
    IMPORT_CHANGES+=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
        --change 'CMD ["/bin/bash"]')
fi

say "importing rootfs as $TAG"
tar --numeric-owner -C "$ROOT" -c . | docker import "${IMPORT_CHANGES[@]}" - "$TAG" >&2 ||
    die "docker import failed"
docker run --rm --network none "$TAG" /bin/sh -c 'id agent >/dev/null && test -d /workspace' ||
    die "image $TAG failed its smoke check"
if [ "$PYTHON" -eq 1 ]; then
    docker run --rm --network none --user 2000000000:2000000000 "$TAG" python -c 'import csv, json, sys' ||
        die "image $TAG: its python does not run"
fi
say "built $TAG"
echo "$TAG"
