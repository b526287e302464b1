#!/usr/bin/env bash
# Runs `scopefs bench` against a native directory, bindfs (a libfuse pass-through of a native
# directory on the same disk), scopefs on the local object store, scopefs on Garage, s3fs and
# rclone (--vfs-cache-mode full) on the same Garage, then prints ONE table with every target's
# seconds and the ratios (`scopefs bench compare`), plus the scopefs daemon's peak RSS.
#
#   bash scripts/bench-compare.sh [BENCH ARGS...]     e.g. --size-mib 1024 --files 10000
#
# TARGETS="native bindfs ..." picks targets; SCOPEFS_BENCH_FUSE adds TOML lines to the scopefs
# daemon's [fuse] section (e.g. SCOPEFS_BENCH_FUSE='writeback_cache = true') to measure a
# kernel fast path with and without; SCOPEFS_BENCH_READAHEAD_KB sets the scopefs mounts' readahead.
# Needs root, a release build (cargo build --release --workspace, or SCOPEFS_BIN=path), bindfs,
# s3fs, rclone and fuse3 (scripts/install-deps.sh), and Garage (scripts/garage.sh start) for the
# Garage targets. Everything it creates lives under $BENCH_DIR (default /tmp/scopefs-bench-compare)
# and every mount is unmounted at the end. Results: $RESULTS (default $BENCH_DIR/results):
# <target>.json per target and compare.md, the table.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SCOPEFS_BIN:-$REPO/target/release/scopefs}
BENCH_DIR=${BENCH_DIR:-/tmp/scopefs-bench-compare}
TARGETS=${TARGETS:-"native bindfs scopefs-local scopefs-garage s3fs rclone"}
RESULTS=${RESULTS:-$BENCH_DIR/results}
ARGS=("$@")
[ -x "$BIN" ] || { echo "bench-compare: $BIN missing; build with cargo build --release --workspace" >&2; exit 1; }
eval "$(bash "$REPO/scripts/garage.sh" env)"
GARAGE_CFG=$SCOPEFS_TEST_GARAGE_CONFIG
GARAGE=$(command -v garage || echo "$HOME/.cargo/bin/garage")
KEY=$SCOPEFS_TEST_S3_ACCESS_KEY_ID
SECRET=$SCOPEFS_TEST_S3_SECRET_ACCESS_KEY
ENDPOINT=$SCOPEFS_TEST_S3_ENDPOINT

mkdir -p "$RESULTS"
rm -f "$RESULTS"/*.json "$RESULTS/compare.md"
DAEMON_PID=""
WORKER_PID=""
MOUNTS=()
cleanup() {
    for m in "${MOUNTS[@]}"; do umount -l "$m" 2>/dev/null || true; done
    if [ -n "$DAEMON_PID" ]; then kill -TERM "$DAEMON_PID" 2>/dev/null || true; wait "$DAEMON_PID" 2>/dev/null || true; fi
}
trap cleanup EXIT

bucket() { # a fresh bucket for one target
    local b=$1
    timeout 60 "$GARAGE" -c "$GARAGE_CFG" bucket create "$b" >/dev/null 2>&1 || true
    timeout 60 "$GARAGE" -c "$GARAGE_CFG" bucket allow --read --write --owner "$b" --key "$KEY" >/dev/null
}

run_bench() { # name dir [pid of the daemon serving dir]
    echo "== $1" >&2
    local pid=()
    [ -n "${3:-}" ] && pid=(--daemon-pid "$3")
    "$BIN" bench "$2" "${ARGS[@]}" --json --label "$1" "${pid[@]}" >"$RESULTS/$1.json"
}

start_scopefs() { # name, extra env...
    local name=$1
    shift
    local d="$BENCH_DIR/$name"
    rm -rf "$d"
    mkdir -p "$d"
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    printf 'data_dir = "%s/data"\nmount_root = "%s/mnt"\nlisten = "127.0.0.1:%s"\nservice_token = "bench"\nquota_bytes = 68719476736\n[fuse]\n%s\n' \
        "$d" "$d" "$port" "${SCOPEFS_BENCH_FUSE:-}" >"$d/scopefs.toml"
    env "$@" "$BIN" --config "$d/scopefs.toml" serve >"$d/daemon.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break; sleep 0.1; done
    # `serve` is a supervisor; the worker (its child) is the daemon that serves the mounts.
    WORKER_PID=$(pgrep -P "$DAEMON_PID" | head -n1 || true)
    [ -n "$WORKER_PID" ] || WORKER_PID=$DAEMON_PID
    local scope
    scope=$(curl -fsS -H 'Authorization: Bearer bench' -H 'content-type: application/json' \
        -d '{"operation_id":"bench","primary_thread_id":"bench"}' \
        "http://127.0.0.1:$port/internal/workspace-scopes/provision" | python3 -c 'import json,sys; print(json.load(sys.stdin)["scope_id"])')
    MNT="$d/mnt/$scope"
    # The kernel offers FUSE at most its default readahead (128 KiB) at init; more is a sysfs knob.
    if [ -n "${SCOPEFS_BENCH_READAHEAD_KB:-}" ]; then
        echo "$SCOPEFS_BENCH_READAHEAD_KB" >"/sys/class/bdi/$(mountpoint -d "$MNT")/read_ahead_kb"
    fi
}

stop_scopefs() {
    kill -TERM "$DAEMON_PID"
    wait "$DAEMON_PID" || true
    DAEMON_PID=""
}

for t in $TARGETS; do
    case $t in
    native)
        rm -rf "$BENCH_DIR/native" && mkdir -p "$BENCH_DIR/native"
        run_bench native "$BENCH_DIR/native"
        ;;
    bindfs)
        src="$BENCH_DIR/bindfs-src"
        m="$BENCH_DIR/bindfs-mnt"
        rm -rf "$src" && mkdir -p "$src" "$m"
        bindfs "$src" "$m"
        MOUNTS+=("$m")
        run_bench bindfs "$m"
        umount -l "$m"
        ;;
    scopefs-local)
        start_scopefs scopefs-local SCOPEFS_LOG=warn
        run_bench scopefs-local "$MNT" "$WORKER_PID"
        stop_scopefs
        ;;
    scopefs-garage)
        bucket scopefs-bench
        start_scopefs scopefs-garage SCOPEFS_LOG=warn SCOPEFS_S3_ENDPOINT="$ENDPOINT" SCOPEFS_S3_REGION=garage \
            SCOPEFS_S3_BUCKET=scopefs-bench SCOPEFS_S3_PREFIX="run-$(date +%s)" \
            SCOPEFS_S3_ACCESS_KEY_ID="$KEY" SCOPEFS_S3_SECRET_ACCESS_KEY="$SECRET"
        run_bench scopefs-garage "$MNT" "$WORKER_PID"
        stop_scopefs
        ;;
    s3fs)
        bucket s3fs-bench
        m="$BENCH_DIR/s3fs-mnt"
        mkdir -p "$m"
        printf '%s:%s\n' "$KEY" "$SECRET" >"$BENCH_DIR/s3fs-passwd"
        chmod 600 "$BENCH_DIR/s3fs-passwd"
        s3fs s3fs-bench "$m" -o passwd_file="$BENCH_DIR/s3fs-passwd" -o url="$ENDPOINT" \
            -o use_path_request_style -o endpoint=garage -o sigv4
        MOUNTS+=("$m")
        run_bench s3fs "$m"
        umount -l "$m"
        ;;
    rclone)
        bucket rclone-bench
        m="$BENCH_DIR/rclone-mnt"
        mkdir -p "$m"
        env -u AWS_CA_BUNDLE RCLONE_CONFIG_GB_TYPE=s3 RCLONE_CONFIG_GB_PROVIDER=Other \
            RCLONE_CONFIG_GB_ENDPOINT="$ENDPOINT" RCLONE_CONFIG_GB_REGION=garage \
            RCLONE_CONFIG_GB_ACCESS_KEY_ID="$KEY" RCLONE_CONFIG_GB_SECRET_ACCESS_KEY="$SECRET" \
            RCLONE_CONFIG_GB_FORCE_PATH_STYLE=true \
            rclone mount gb:rclone-bench "$m" --vfs-cache-mode full --cache-dir "$BENCH_DIR/rclone-cache" --daemon
        MOUNTS+=("$m")
        for _ in $(seq 1 50); do mountpoint -q "$m" && break; sleep 0.2; done
        run_bench rclone "$m"
        umount -l "$m"
        ;;
    *) echo "bench-compare: unknown target $t" >&2; exit 2 ;;
    esac
done

"$BIN" bench compare "$RESULTS" | tee "$RESULTS/compare.md"
