#!/usr/bin/env bash
# Runs `scopefs bench` against a native directory, scopefs on the local object store, scopefs on
# Garage, s3fs and rclone (--vfs-cache-mode full) on the same Garage, and prints each table.
#
#   bash scripts/bench-compare.sh [BENCH ARGS...]     e.g. --size-mib 1024 --files 10000
#
# Needs root, a release build (cargo build --release -p scopefs-daemon, or SCOPEFS_BIN=path),
# s3fs, rclone and fuse3 (scripts/install-deps.sh), and Garage (scripts/garage.sh start).
# Everything it creates lives under $BENCH_DIR (default /tmp/scopefs-bench-compare) and every
# mount is unmounted at the end. Results: $BENCH_DIR/results/<target>.txt.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SCOPEFS_BIN:-$REPO/target/release/scopefs}
BENCH_DIR=${BENCH_DIR:-/tmp/scopefs-bench-compare}
TARGETS=${TARGETS:-"native scopefs-local scopefs-garage s3fs rclone"}
ARGS=("$@")
[ -x "$BIN" ] || { echo "bench-compare: $BIN missing; build with cargo build --release -p scopefs-daemon" >&2; exit 1; }
eval "$(bash "$REPO/scripts/garage.sh" env)"
GARAGE_CFG=$SCOPEFS_TEST_GARAGE_CONFIG
GARAGE=$(command -v garage || echo "$HOME/.cargo/bin/garage")
KEY=$SCOPEFS_TEST_S3_ACCESS_KEY_ID
SECRET=$SCOPEFS_TEST_S3_SECRET_ACCESS_KEY
ENDPOINT=$SCOPEFS_TEST_S3_ENDPOINT

mkdir -p "$BENCH_DIR/results"
DAEMON_PID=""
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

run_bench() { # name dir
    echo "== $1" >&2
    "$BIN" bench "$2" "${ARGS[@]}" | tee "$BENCH_DIR/results/$1.txt"
}

start_scopefs() { # name, extra env...
    local name=$1
    shift
    local d="$BENCH_DIR/$name"
    rm -rf "$d"
    mkdir -p "$d"
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    printf 'data_dir = "%s/data"\nmount_root = "%s/mnt"\nlisten = "127.0.0.1:%s"\nservice_token = "bench"\nquota_bytes = 68719476736\n' \
        "$d" "$d" "$port" >"$d/scopefs.toml"
    env "$@" "$BIN" --config "$d/scopefs.toml" serve >"$d/daemon.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break; sleep 0.1; done
    local scope
    scope=$(curl -fsS -H 'Authorization: Bearer bench' -H 'content-type: application/json' \
        -d '{"operation_id":"bench","primary_thread_id":"bench"}' \
        "http://127.0.0.1:$port/internal/workspace-scopes/provision" | python3 -c 'import json,sys; print(json.load(sys.stdin)["scope_id"])')
    MNT="$d/mnt/$scope"
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
    scopefs-local)
        start_scopefs scopefs-local SCOPEFS_LOG=warn
        run_bench scopefs-local "$MNT"
        stop_scopefs
        ;;
    scopefs-garage)
        bucket scopefs-bench
        start_scopefs scopefs-garage SCOPEFS_LOG=warn SCOPEFS_S3_ENDPOINT="$ENDPOINT" SCOPEFS_S3_REGION=garage \
            SCOPEFS_S3_BUCKET=scopefs-bench SCOPEFS_S3_PREFIX="run-$(date +%s)" \
            SCOPEFS_S3_ACCESS_KEY_ID="$KEY" SCOPEFS_S3_SECRET_ACCESS_KEY="$SECRET"
        run_bench scopefs-garage "$MNT"
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
