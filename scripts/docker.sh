#!/usr/bin/env bash
# Makes sure a Docker engine answers and the local test image exists.
#
#   scripts/docker.sh [--rebuild]
#
# - starts dockerd in the background when /var/run/docker.sock does not answer
#   (log: .test-state/dockerd.log; it is left running afterwards),
# - builds the busybox test image `scopefs-test:busybox`, and `scopefs-test:python`
#   (the same with the host's python3, for the seed's gateway smoke test), with
#   packaging/sandbox-image/build-offline.sh — no image registry involved;
#   each skipped when it already exists (--rebuild forces them).
#
# Progress goes to stderr. The only stdout lines are
#   export SCOPEFS_TEST_DOCKER_IMAGE=scopefs-test:busybox
#   export SCOPEFS_TEST_PYTHON_IMAGE=scopefs-test:python
# so callers can `eval "$(bash scripts/docker.sh)"`. SCOPEFS_TEST_DOCKER_IMAGE_TAG
# overrides the first tag.
set -euo pipefail

die() {
    echo "docker.sh: ERROR: $*" >&2
    exit 1
}
say() { echo "docker.sh: $*" >&2; }

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE="$REPO/.test-state"
IMAGE="${SCOPEFS_TEST_DOCKER_IMAGE_TAG:-scopefs-test:busybox}"
REBUILD=()
[ "${1:-}" = "--rebuild" ] && REBUILD=(--force)

command -v docker >/dev/null 2>&1 || die "docker CLI not found (run scripts/install-deps.sh)"
command -v dockerd >/dev/null 2>&1 || die "dockerd not found (run scripts/install-deps.sh)"

if ! docker version >/dev/null 2>&1; then
    [ "$(id -u)" -eq 0 ] || die "Docker engine not answering and starting dockerd needs root"
    mkdir -p "$STATE"
    if pgrep -x dockerd >/dev/null 2>&1; then
        say "dockerd is running but not answering yet; waiting"
    else
        say "starting dockerd (log: .test-state/dockerd.log)"
        # setsid: dockerd must outlive this script and the test run.
        setsid dockerd >>"$STATE/dockerd.log" 2>&1 </dev/null &
    fi
    for _ in $(seq 1 60); do
        docker version >/dev/null 2>&1 && break
        sleep 1
    done
    docker version >/dev/null 2>&1 ||
        die "Docker engine did not answer within 60 s; last log lines:
$(tail -n 20 "$STATE/dockerd.log" 2>/dev/null)"
fi
say "Docker engine $(docker version --format '{{.Server.Version}}' 2>/dev/null) answering"

bash "$REPO/packaging/sandbox-image/build-offline.sh" --tag "$IMAGE" "${REBUILD[@]}" >/dev/null ||
    die "building the test image $IMAGE failed"
docker image inspect "$IMAGE" >/dev/null 2>&1 || die "image $IMAGE missing after build"
PYTHON_IMAGE=scopefs-test:python
bash "$REPO/packaging/sandbox-image/build-offline.sh" --python --tag "$PYTHON_IMAGE" "${REBUILD[@]}" >/dev/null ||
    die "building the test image $PYTHON_IMAGE failed"
docker image inspect "$PYTHON_IMAGE" >/dev/null 2>&1 || die "image $PYTHON_IMAGE missing after build"

echo "export SCOPEFS_TEST_DOCKER_IMAGE=$IMAGE"
echo "export SCOPEFS_TEST_PYTHON_IMAGE=$PYTHON_IMAGE"
