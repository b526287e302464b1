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
# kernel fast path with and without; SCOPEFS_BENCH_READAHEAD_KB sets the scopefs mounts' readahead;
# SCOPEFS_BENCH_ENV adds VAR=VALUE words to the scopefs daemons' environment; SCOPEFS_DAEMON_BIN
# serves the scopefs targets with another build than the one that drives the workloads (an older
# commit's binary against today's, the same workloads timed).
# Needs root, a release build (cargo build --release --workspace, or SCOPEFS_BIN=path), bindfs,
# s3fs, rclone and fuse3 (scripts/install-deps.sh), and Garage (scripts/garage.sh start) for the
# Garage targets. Everything it creates lives under $BENCH_DIR (default /tmp/scopefs-bench-compare)
# and every mount is unmounted at the end. Results: $RESULTS (default $BENCH_DIR/results):
# <target>.json per target and compare.md, the table.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SCOPEFS_BIN:-$REPO/target/release/scopefs}
DAEMON_BIN=${SCOPEFS_DAEMON_BIN:-$BIN}
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

die() {
    echo "bench-compare: $*" >&2
    exit 1
}

# wait_for WHAT TRIES DELAY CMD...: runs CMD until it succeeds, at most TRIES times DELAY seconds
# apart; fails the run naming WHAT when it never does.
wait_for() {
    local what=$1 tries=$2 delay=$3 i
    shift 3
    for ((i = 0; i < tries; i++)); do
        "$@" && return 0
        sleep "$delay"
    done
    die "$what did not happen within $(python3 -c "print($tries * $delay)") s"
}

# fresh_dir DIR: DIR, empty. A crashed earlier run may have left a FUSE mount below it (a stale one
# answers ENOTCONN, and rm -rf would descend into a live one): detach those first, and never let
# rm cross into another file system.
fresh_dir() {
    local dir=$1 m
    if [ -e "$dir" ]; then
        # Field 5 of mountinfo is the mount point (octal escapes for spaces; none in our paths).
        # Deepest first, so nested mounts go before their parents.
        while read -r m; do
            umount -l "$m" 2>/dev/null || die "cannot detach the mount $m left under $dir"
        done < <(awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r)
        rm -rf --one-file-system "$dir"
    fi
    mkdir -p "$dir"
}

bucket() { # a fresh bucket for one target
    local b=$1
    timeout 60 "$GARAGE" -c "$GARAGE_CFG" bucket create "$b" >/dev/null 2>&1 || true
    timeout 60 "$GARAGE" -c "$GARAGE_CFG" bucket allow --read --write --owner "$b" --key "$KEY" >/dev/null
}

run_bench() { # name dir [pid of the daemon serving dir] [pid of its object store's server]
    echo "== $1" >&2
    local pid=()
    [ -n "${3:-}" ] && pid=(--daemon-pid "$3")
    # Each workload's CPU time of the daemon and of the store's server lands in the JSON report.
    [ -n "${4:-}" ] && pid+=(--cpu-pid "$4")
    "$BIN" bench "$2" "${ARGS[@]}" --json --label "$1" "${pid[@]}" >"$RESULTS/$1.json"
}

# start_scopefs NAME [VAR=VALUE...]: starts `scopefs serve` under $BENCH_DIR/NAME with the given
# environment, waits for /ready and provisions one scope. Sets DAEMON_PID (the supervisor),
# WORKER_PID (the process serving the mounts), SCOPE_MNT (the scope's mountpoint) and SCOPE_PORT
# (its API's port).
start_scopefs() {
    local name=$1
    shift
    local d="$BENCH_DIR/$name"
    fresh_dir "$d"
    local port
    SCOPE_PORT=""
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    printf 'data_dir = "%s/data"\nmount_root = "%s/mnt"\nlisten = "127.0.0.1:%s"\nservice_token = "bench"\nquota_bytes = 68719476736\n[fuse]\n%s\n' \
        "$d" "$d" "$port" "${SCOPEFS_BENCH_FUSE:-}" >"$d/scopefs.toml"
    # SCOPEFS_BENCH_ENV: extra VAR=VALUE words for the scopefs daemons (e.g. a config key's
    # SCOPEFS_* override, to measure a setting with and without).
    # shellcheck disable=SC2086
    env -u SCOPEFS_BENCH_ENV -u SCOPEFS_DAEMON_BIN "$@" ${SCOPEFS_BENCH_ENV:-} "$DAEMON_BIN" --config "$d/scopefs.toml" serve >"$d/daemon.log" 2>&1 &
    DAEMON_PID=$!
    wait_for "scopefs $name ready (log: $d/daemon.log)" 600 0.1 daemon_ready "$name" "$port" "$d/daemon.log"
    # `serve` is a supervisor; the worker (its child) is the daemon that serves the mounts.
    WORKER_PID=$(pgrep -P "$DAEMON_PID" | head -n1 || true)
    [ -n "$WORKER_PID" ] || WORKER_PID=$DAEMON_PID
    local scope
    scope=$(curl -fsS -H 'Authorization: Bearer bench' -H 'content-type: application/json' \
        -d '{"operation_id":"bench","primary_thread_id":"bench"}' \
        "http://127.0.0.1:$port/internal/workspace-scopes/provision" | python3 -c 'import json,sys; print(json.load(sys.stdin)["scope_id"])') ||
        die "provisioning the bench scope of $name failed (log: $d/daemon.log)"
    SCOPE_MNT="$d/mnt/$scope"
    SCOPE_PORT=$port
    mountpoint -q "$SCOPE_MNT" || die "$SCOPE_MNT is not mounted (log: $d/daemon.log)"
    # The kernel offers FUSE at most its default readahead (128 KiB) at init; more is a sysfs knob.
    if [ -n "${SCOPEFS_BENCH_READAHEAD_KB:-}" ]; then
        echo "$SCOPEFS_BENCH_READAHEAD_KB" >"/sys/class/bdi/$(mountpoint -d "$SCOPE_MNT")/read_ahead_kb"
    fi
}

# daemon_ready NAME PORT LOG: whether the daemon of start_scopefs answers /ready; a daemon that
# exited fails the run at once.
daemon_ready() {
    kill -0 "$DAEMON_PID" 2>/dev/null || die "scopefs $1 exited before it was ready (log: $3)"
    curl -fs -o /dev/null "http://127.0.0.1:$2/ready"
}

# save_metrics NAME: keeps the daemon's /metrics after its run as $RESULTS/NAME.metrics (what it
# shipped, snapshotted, committed: to explain a run's time).
save_metrics() {
    curl -fsS -H 'Authorization: Bearer bench' "http://127.0.0.1:$SCOPE_PORT/metrics" >"$RESULTS/$1.metrics" ||
        echo "bench-compare: could not read the /metrics of $1" >&2
}

# stop_scopefs: stops the daemon of start_scopefs (which unmounts its scopes); a daemon that already
# died is reported, not fatal (its log tells why).
stop_scopefs() {
    if ! kill -TERM "$DAEMON_PID" 2>/dev/null; then
        echo "bench-compare: the scopefs daemon (pid $DAEMON_PID) had already exited" >&2
    fi
    wait "$DAEMON_PID" || true
    DAEMON_PID=""
}

# quiet_garage: waits (at most 5 minutes) until the Garage server is idle: it deletes and collects
# the objects of an earlier target in the background, and that work would be timed with the next
# target (on 2 cores it takes most of one).
quiet_garage() {
    local pid i a b
    pid=$(pgrep -x garage | head -n1 || true)
    [ -n "$pid" ] || return 0
    for ((i = 0; i < 150; i++)); do
        a=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
        sleep 2
        b=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
        # Under 5 % of one core over 2 s (clock ticks of 10 ms).
        [ $((b - a)) -lt 10 ] && return 0
    done
    echo "bench-compare: Garage stayed busy for 5 minutes; measuring anyway" >&2
}

for t in $TARGETS; do
    quiet_garage
    case $t in
    native)
        fresh_dir "$BENCH_DIR/native"
        run_bench native "$BENCH_DIR/native"
        ;;
    bindfs)
        src="$BENCH_DIR/bindfs-src"
        m="$BENCH_DIR/bindfs-mnt"
        fresh_dir "$src"
        fresh_dir "$m"
        bindfs "$src" "$m"
        MOUNTS+=("$m")
        run_bench bindfs "$m"
        umount -l "$m"
        ;;
    scopefs-local)
        start_scopefs scopefs-local SCOPEFS_LOG=warn
        run_bench scopefs-local "$SCOPE_MNT" "$WORKER_PID"
        save_metrics scopefs-local
        stop_scopefs
        ;;
    scopefs-garage)
        bucket scopefs-bench
        start_scopefs scopefs-garage SCOPEFS_LOG=warn SCOPEFS_S3_ENDPOINT="$ENDPOINT" SCOPEFS_S3_REGION=garage \
            SCOPEFS_S3_BUCKET=scopefs-bench SCOPEFS_S3_PREFIX="run-$(date +%s)" \
            SCOPEFS_S3_ACCESS_KEY_ID="$KEY" SCOPEFS_S3_SECRET_ACCESS_KEY="$SECRET"
        run_bench scopefs-garage "$SCOPE_MNT" "$WORKER_PID" "$(pgrep -x garage | head -n1 || true)"
        save_metrics scopefs-garage
        stop_scopefs
        ;;
    s3fs)
        bucket s3fs-bench
        m="$BENCH_DIR/s3fs-mnt"
        fresh_dir "$m"
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
        fresh_dir "$m"
        env -u AWS_CA_BUNDLE RCLONE_CONFIG_GB_TYPE=s3 RCLONE_CONFIG_GB_PROVIDER=Other \
            RCLONE_CONFIG_GB_ENDPOINT="$ENDPOINT" RCLONE_CONFIG_GB_REGION=garage \
            RCLONE_CONFIG_GB_ACCESS_KEY_ID="$KEY" RCLONE_CONFIG_GB_SECRET_ACCESS_KEY="$SECRET" \
            RCLONE_CONFIG_GB_FORCE_PATH_STYLE=true \
            rclone mount gb:rclone-bench "$m" --vfs-cache-mode full --cache-dir "$BENCH_DIR/rclone-cache" --daemon
        MOUNTS+=("$m")
        wait_for "the rclone mount at $m" 50 0.2 mountpoint -q "$m"
        run_bench rclone "$m"
        umount -l "$m"
        ;;
    *) echo "bench-compare: unknown target $t" >&2; exit 2 ;;
    esac
done

"$BIN" bench compare "$RESULTS" | tee "$RESULTS/compare.md"
