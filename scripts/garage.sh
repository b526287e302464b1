#!/usr/bin/env bash
# Single-node Garage S3 server for scopefs tests.
#
#   scripts/garage.sh start    install garage if missing, write the config, start the
#                              server, apply the layout, create the test bucket and key
#                              (idempotent: a running, configured server is left alone)
#   scripts/garage.sh stop     stop the server (data is kept; `start` brings it back)
#   scripts/garage.sh status   exit 0 if the server is running and answers
#   scripts/garage.sh env      print `export SCOPEFS_TEST_S3_*=...` lines for `eval`
#
# State (config, metadata, data, pid and log) lives in $SCOPEFS_TEST_STATE/garage,
# else next to $SCOPEFS_TEST_GARAGE_CONFIG (as printed by `env`), else in
# <repo>/.test-state/garage (git-ignored). Everything listens on loopback
# only: S3 API 3900, RPC 3901, admin 3903. The access key is a fixed test key;
# never use this setup for real data.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -n "${SCOPEFS_TEST_STATE:-}" ]; then
    STATE="$SCOPEFS_TEST_STATE/garage"
elif [ -n "${SCOPEFS_TEST_GARAGE_CONFIG:-}" ]; then
    # Called from a test: act on the server that `env` described.
    STATE=$(dirname "$SCOPEFS_TEST_GARAGE_CONFIG")
else
    STATE="$REPO/.test-state/garage"
fi
CONFIG="$STATE/garage.toml"
PIDFILE="$STATE/garage.pid"
LOGFILE="$STATE/garage.log"

S3_PORT=3900
RPC_PORT=3901
ADMIN_PORT=3903
REGION=garage
BUCKET=scopefs-test
KEY_NAME=scopefs-test-key
# Fixed test credentials (Garage key ids are "GK" + 24 hex digits, secrets 64 hex digits).
KEY_ID=GK5c0fe5e57c0ffee0a11ce5e5
KEY_SECRET=5c0fe55ec12e7000000000000000000000000000000000000000000000000001

die() {
    echo "garage.sh: $*" >&2
    exit 1
}

find_garage() {
    if command -v garage >/dev/null 2>&1; then
        command -v garage
    elif [ -x "$HOME/.cargo/bin/garage" ]; then
        echo "$HOME/.cargo/bin/garage"
    else
        return 1
    fi
}

ensure_garage() {
    if GARAGE=$(find_garage); then
        return 0
    fi
    command -v cargo >/dev/null 2>&1 || die "garage is not installed and cargo is not available to install it"
    echo "garage.sh: installing garage with cargo (takes several minutes)..." >&2
    cargo install garage --locked >&2 || die "cargo install garage failed"
    GARAGE=$(find_garage) || die "garage still not found after installation"
}

g() {
    # Every admin call is bounded: a server that is restarting must not hang the caller.
    timeout 60 "$GARAGE" -c "$CONFIG" "$@"
}

write_config() {
    mkdir -p "$STATE/meta" "$STATE/data"
    chmod 700 "$STATE"
    if [ -f "$CONFIG" ]; then
        return 0
    fi
    local rpc_secret admin_token
    rpc_secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
    admin_token=$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')
    [ "${#rpc_secret}" -eq 64 ] || die "could not generate an rpc secret"
    umask 077
    cat >"$CONFIG.tmp" <<EOF
# Written by scripts/garage.sh: single-node test server, loopback only.
metadata_dir = "$STATE/meta"
data_dir = "$STATE/data"
db_engine = "sqlite"
replication_factor = 1

rpc_bind_addr = "127.0.0.1:$RPC_PORT"
rpc_public_addr = "127.0.0.1:$RPC_PORT"
rpc_secret = "$rpc_secret"

[s3_api]
s3_region = "$REGION"
api_bind_addr = "127.0.0.1:$S3_PORT"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$ADMIN_PORT"
admin_token = "$admin_token"
EOF
    mv "$CONFIG.tmp" "$CONFIG"
}

server_pid() {
    [ -f "$PIDFILE" ] || return 1
    local pid
    pid=$(cat "$PIDFILE")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    # Make sure the pid was not reused by an unrelated process.
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep "garage" >/dev/null || return 1
    echo "$pid"
}

# process_gone PID: the process has exited (no /proc entry, or a zombie waiting to be reaped).
process_gone() {
    local state
    state=$(sed -n 's/^[0-9]* (.*) \([A-Za-z]\).*/\1/p' "/proc/$1/stat" 2>/dev/null) || return 0
    [ -z "$state" ] || [ "$state" = Z ] || [ "$state" = X ]
}

s3_answers() {
    # Any HTTP answer (403 for an anonymous request) means the S3 API is up.
    local code
    code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$S3_PORT/" 2>/dev/null) || return 1
    [ "$code" != "000" ]
}

start_server() {
    if server_pid >/dev/null; then
        return 0
    fi
    if s3_answers; then
        die "port $S3_PORT already answers but not from the garage started by this script (pid file $PIDFILE); stop it first"
    fi
    echo "garage.sh: starting garage server (log: $LOGFILE)" >&2
    # setsid: the server must outlive the shell (and test process) that started it. setsid forks
    # when its caller leads a process group (job control), so the server writes its own pid.
    rm -f "$PIDFILE"
    # shellcheck disable=SC2016 # $$ and $@ are the inner shell's
    setsid sh -c 'echo $$ >"$1"; shift; exec "$@"' sh "$PIDFILE" "$GARAGE" -c "$CONFIG" server \
        </dev/null >>"$LOGFILE" 2>&1 &
    for _ in $(seq 1 50); do
        [ -s "$PIDFILE" ] && return 0
        sleep 0.1
    done
    die "garage server did not start (no pid file; see $LOGFILE)"
}

# The process started by start_server is alive (not exited, not a zombie). Unlike server_pid it
# does not read /proc/PID/cmdline, which is briefly empty while `sh` execs garage.
server_alive() {
    local pid state
    pid=$(cat "$PIDFILE" 2>/dev/null) && [ -n "$pid" ] || return 1
    state=$(sed -n 's/^[0-9]* (.*) \([A-Za-z]\) .*/\1/p' "/proc/$pid/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != "Z" ] && [ "$state" != "X" ]
}

wait_ready() {
    for _ in $(seq 1 100); do
        if ! server_alive; then
            tail -n 20 "$LOGFILE" >&2 || true
            die "garage server exited during startup (see $LOGFILE)"
        fi
        if g status >/dev/null 2>&1 && s3_answers; then
            return 0
        fi
        sleep 0.2
    done
    tail -n 20 "$LOGFILE" >&2 || true
    die "garage server did not answer within 20 s (see $LOGFILE)"
}

ensure_layout() {
    local status
    status=$(g status 2>&1) || die "garage status failed: $status"
    if ! grep -q "NO ROLE ASSIGNED" <<<"$status"; then
        return 0
    fi
    local node_id version
    node_id=$(g node id -q 2>/dev/null | cut -d@ -f1) || die "cannot read the garage node id"
    [ -n "$node_id" ] || die "garage returned an empty node id"
    g layout assign -z dc1 -c 1G "$node_id" >/dev/null || die "garage layout assign failed"
    version=$(g layout show 2>/dev/null | sed -n 's/.*[Cc]urrent cluster layout version: *\([0-9]\+\).*/\1/p' | head -n1)
    version=$(( ${version:-0} + 1 ))
    g layout apply --version "$version" >/dev/null || die "garage layout apply --version $version failed"
}

ensure_bucket_and_key() {
    local ok=0
    # Right after the layout is applied the cluster may need a moment.
    for _ in $(seq 1 50); do
        if g bucket info "$BUCKET" >/dev/null 2>&1 || g bucket create "$BUCKET" >/dev/null 2>&1; then
            ok=1
            break
        fi
        sleep 0.2
    done
    [ "$ok" -eq 1 ] || die "cannot create bucket $BUCKET: $(g bucket create "$BUCKET" 2>&1 | tail -n 3)"
    if ! g key info "$KEY_ID" >/dev/null 2>&1; then
        local out
        out=$(g key import --yes -n "$KEY_NAME" "$KEY_ID" "$KEY_SECRET" 2>&1) || die "garage key import failed: $out"
    fi
    g bucket allow --read --write --owner "$BUCKET" --key "$KEY_ID" >/dev/null || die "garage bucket allow failed"
}

wait_s3_ready() {
    # The S3 API accepts the test key once the bucket/key tables have propagated.
    local code EMPTY_SHA256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
    for _ in $(seq 1 50); do
        code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' -H "x-amz-content-sha256: $EMPTY_SHA256" \
            --aws-sigv4 "aws:amz:$REGION:s3" --user "$KEY_ID:$KEY_SECRET" \
            "http://127.0.0.1:$S3_PORT/$BUCKET?list-type=2&max-keys=1" 2>/dev/null) || code=000
        [ "$code" = "200" ] && return 0
        sleep 0.2
    done
    die "the S3 API does not accept the test key on bucket $BUCKET (last HTTP status $code)"
}

cmd_start() {
    ensure_garage
    write_config
    start_server
    wait_ready
    ensure_layout
    ensure_bucket_and_key
    wait_s3_ready
    echo "garage.sh: garage is running at http://127.0.0.1:$S3_PORT, bucket $BUCKET" >&2
}

cmd_stop() {
    local pid
    if ! pid=$(server_pid); then
        rm -f "$PIDFILE"
        echo "garage.sh: garage is not running" >&2
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        process_gone "$pid" && break
        sleep 0.1
    done
    if ! process_gone "$pid"; then
        kill -KILL "$pid" 2>/dev/null || true
        # A killed Garage holding client connections can take seconds to go: wait until
        # the process is really gone (or a zombie nobody reaps yet), up to 60 s.
        for _ in $(seq 1 600); do
            process_gone "$pid" && break
            sleep 0.1
        done
    fi
    process_gone "$pid" || die "garage (pid $pid) did not stop within 60 s of SIGKILL"
    rm -f "$PIDFILE"
    echo "garage.sh: garage stopped" >&2
}

cmd_status() {
    GARAGE=$(find_garage) || die "garage is not installed"
    [ -f "$CONFIG" ] || die "garage is not configured ($CONFIG missing)"
    server_pid >/dev/null || die "garage is not running"
    s3_answers || die "garage is running but its S3 API does not answer"
    echo "garage.sh: garage is running" >&2
}

cmd_env() {
    cat <<EOF
export SCOPEFS_TEST_S3_ENDPOINT=http://127.0.0.1:$S3_PORT
export SCOPEFS_TEST_S3_REGION=$REGION
export SCOPEFS_TEST_S3_BUCKET=$BUCKET
export SCOPEFS_TEST_S3_ACCESS_KEY_ID=$KEY_ID
export SCOPEFS_TEST_S3_SECRET_ACCESS_KEY=$KEY_SECRET
export SCOPEFS_TEST_GARAGE_CONFIG=$CONFIG
EOF
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) cmd_env ;;
    *)
        echo "usage: $0 start|stop|status|env" >&2
        exit 2
        ;;
esac
