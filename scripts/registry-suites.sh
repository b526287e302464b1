#!/usr/bin/env bash
# The registry and billing suites on both registry backends (issue 23 d): the registry's unit tests
# (`registry::`, `billing::` of the lib, the daemon's `services::` that drive it) and the
# `billing` target, first on embedded SQLite, then on
# PostgreSQL (each test in a fresh schema of the database SCOPEFS_TEST_POSTGRES_URL names; the
# billing target's daemons are configured with `[registry] url` too).
#
#   bash scripts/registry-suites.sh POSTGRES_URL
#
# Prints `summary: registry+billing suites on <backend>: N passed, M failed` for each backend (the
# test command copies these lines into its summary). Fails if either run fails or runs no test.
set -uo pipefail

URL=${1:?usage: registry-suites.sh POSTGRES_URL}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 1
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
STATUS=0

# run BACKEND: both suites with the environment as it is; counts what cargo reported.
run() {
    local backend=$1 rc=0
    : >"$LOG"
    cargo test --locked --workspace --lib -- registry:: billing:: services:: 2>&1 | tee -a "$LOG" || rc=1
    cargo test --locked --workspace --test billing 2>&1 | tee -a "$LOG" || rc=1
    local passed failed
    passed=$(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed.*/\1/p' "$LOG" | awk '{s += $1} END {print s + 0}')
    failed=$(sed -n 's/^test result: [A-Za-z]*\. [0-9]* passed; \([0-9]*\) failed.*/\1/p' "$LOG" | awk '{s += $1} END {print s + 0}')
    echo "summary: registry+billing suites on $backend: ${passed:-0} passed, ${failed:-0} failed"
    if [ "$rc" -ne 0 ] || [ "${passed:-0}" -eq 0 ]; then
        STATUS=1
    fi
}

unset SCOPEFS_TEST_POSTGRES_URL
run sqlite
export SCOPEFS_TEST_POSTGRES_URL="$URL"
run postgresql
exit "$STATUS"
