#!/usr/bin/env bash
# A scratch PostgreSQL cluster for scopefs tests (Debian's `postgresql` package, run with pg_ctl as
# the `postgres` user; no system service).
#
#   scripts/postgres.sh start    install the package if missing, create the cluster if missing,
#                                start it, create the test database (idempotent)
#   scripts/postgres.sh stop     stop the cluster (data is kept; `start` brings it back)
#   scripts/postgres.sh status   exit 0 if the cluster answers
#   scripts/postgres.sh env      print `export SCOPEFS_TEST_POSTGRES_URL=...` for `eval`
#
# State lives in $SCOPEFS_TEST_STATE/postgres, else <repo>/.test-state/postgres (git-ignored).
# The cluster listens on 127.0.0.1 and, when SCOPEFS_TEST_POSTGRES_LISTEN names more addresses
# (comma-separated), on those too; it trusts every connection: never use this setup for real data.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE="${SCOPEFS_TEST_STATE:-$REPO/.test-state}/postgres"
DATA="$STATE/data"
LOGFILE="$STATE/postgres.log"
PORT="${SCOPEFS_TEST_POSTGRES_PORT:-55432}"
DATABASE=scopefs_test
LISTEN="127.0.0.1${SCOPEFS_TEST_POSTGRES_LISTEN:+,$SCOPEFS_TEST_POSTGRES_LISTEN}"

die() {
    echo "postgres.sh: $*" >&2
    exit 1
}

bindir() {
    local d
    for d in /usr/lib/postgresql/*/bin; do
        if [ -x "$d/pg_ctl" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

ensure_installed() {
    if ! bindir >/dev/null; then
        echo "postgres.sh: installing Debian's postgresql package"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null ||
            die "apt-get install postgresql failed"
    fi
    bindir >/dev/null || die "pg_ctl not found after installing postgresql"
}

as_postgres() {
    runuser -u postgres -- "$@"
}

psql_cmd() {
    as_postgres "$(bindir)/psql" -h 127.0.0.1 -p "$PORT" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"
}

cmd_status() {
    local b
    b=$(bindir) || return 1
    as_postgres "$b/pg_isready" -h 127.0.0.1 -p "$PORT" -q
}

cmd_start() {
    ensure_installed
    local b
    b=$(bindir)
    mkdir -p "$STATE"
    chown postgres: "$STATE"
    if [ ! -s "$DATA/PG_VERSION" ]; then
        as_postgres "$b/initdb" -D "$DATA" -U postgres --auth=trust --locale=C.UTF-8 -E UTF8 >"$STATE/initdb.log" 2>&1 ||
            die "initdb failed (see $STATE/initdb.log)"
        echo "host all all 0.0.0.0/0 trust" >>"$DATA/pg_hba.conf"
    fi
    if ! cmd_status; then
        as_postgres "$b/pg_ctl" -D "$DATA" -l "$LOGFILE" -w -t 60 \
            -o "-c listen_addresses='$LISTEN' -p $PORT -c unix_socket_directories='$STATE' -c max_connections=400 -c fsync=on" \
            start >/dev/null || die "pg_ctl start failed (see $LOGFILE)"
    fi
    if [ "$(psql_cmd -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$DATABASE'")" != 1 ]; then
        psql_cmd -d postgres -c "CREATE DATABASE $DATABASE" || die "creating database $DATABASE failed"
    fi
    echo "postgres.sh: PostgreSQL $("$b/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT, database $DATABASE"
}

cmd_stop() {
    local b
    b=$(bindir) || return 0
    if [ -s "$DATA/PG_VERSION" ] && cmd_status; then
        as_postgres "$b/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
    fi
}

cmd_env() {
    echo "export SCOPEFS_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:$PORT/$DATABASE"
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) cmd_env ;;
    *) die "usage: $0 start|stop|status|env" ;;
esac
