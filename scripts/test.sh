#!/usr/bin/env bash
# The scopefs test command: installs and starts everything the tests need, then
# runs every tier (unit, engine, FUSE, Garage, Docker).
#
#   bash scripts/test.sh              # the whole suite (what CI runs)
#   bash scripts/test.sh NAME...      # setup + lint, then only these test
#                                     # targets (e.g. docker_isolation);
#                                     # `unit` = lib/bin unit tests, `doc` = doctests,
#                                     # `package` = scripts/package-test.sh
#
# Steps, in order (setup and lint steps stop the run at the first failure):
#   1. scripts/install-deps.sh        Debian packages, pjdfstest, fsx, user `tests`
#   2. cargo fmt --check
#   3. cargo clippy --workspace --all-targets -- -D warnings, shellcheck of every script
#   4. scripts/docker.sh              dockerd + local test images (busybox; busybox + python)
#   5. scripts/garage.sh start/env    single-node Garage S3 server + test bucket
#      scripts/postgres.sh start/env  scratch PostgreSQL cluster (Debian's package, pg_ctl) for the
#                                     registry's second backend
#   6. cargo test --no-run            build every test binary once (dev-dependencies turn on the
#                                     `test-hooks` feature of scopefs, as in step 3's clippy; the
#                                     package step's release build leaves it off, and checks that
#                                     the installed binary ignores the hooks)
#   7. test targets, one cargo invocation each: unit tests, doctests, then every
#      integration test target found by `cargo metadata`. Every invocation passes
#      --workspace, so features unify exactly as in step 6 and nothing is rebuilt
#      (`-p <crate>` would resolve features differently and rebuild the tree). All targets run even
#      when one fails; the run fails if any did, or if an integration target
#      ran no test at all. The hostile-tenant suite runs with --nocapture (its
#      request counts and bystander latencies show in the log). Heavy suites
#      (pjdfstest/fsx, crash storms) run with --test-threads=1 and --nocapture (their progress lines, pjdfstest's
#      summaries and any logged etxtbsy retry show in the log even on a pass).
#   8. registry_backends: scripts/registry-suites.sh runs the registry and billing suites on
#      SQLite and on PostgreSQL; the summary says how many tests ran on each.
# A missing prerequisite fails the run; nothing is skipped silently.
#
# Needs root (FUSE mounts, dockerd, apt). Idempotent: a second run reuses the
# installed tools, the running dockerd, the image and Garage. dockerd and
# Garage are left running afterwards so reruns start fast; stop them with
# `scripts/garage.sh stop` and by killing dockerd (log in .test-state/).
#
# Environment knobs: SCOPEFS_TEST_TARGET_TIMEOUT (seconds per ordinary test
# target, default 1200), SCOPEFS_TEST_HEAVY_TIMEOUT (default 2400).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 1
export PATH="$HOME/.cargo/bin:$PATH"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
if [ -n "${CI:-}" ] || [ ! -t 1 ]; then
    export CARGO_TERM_COLOR=never
fi

# Test targets that drive heavy external suites or kill daemons: run serially.
HEAVY_TARGETS=" posix_suites crash_storm worker_kills "
# Targets whose own report (counts, latencies) belongs in the log even on a pass.
REPORTING_TARGETS=" hostile_tenant crash_states crash_recovery crash_faults power_loss forks nodes_failover admin_ui openapi_conformance clients_typescript "
TARGET_TIMEOUT="${SCOPEFS_TEST_TARGET_TIMEOUT:-1200}"
HEAVY_TIMEOUT="${SCOPEFS_TEST_HEAVY_TIMEOUT:-2400}"
FILTER=("$@")
TESTS_PASSED=0
TESTS_FAILED=0

STEP_NAMES=()
STEP_RESULTS=()
STEP_SECONDS=()
RUN_START=$(date +%s)

summary() {
    local total=$(($(date +%s) - RUN_START))
    echo
    echo "==================== scopefs test summary ===================="
    local i
    for i in "${!STEP_NAMES[@]}"; do
        printf '  %-6s %-44s %6ss\n' "${STEP_RESULTS[$i]}" "${STEP_NAMES[$i]}" "${STEP_SECONDS[$i]}"
    done
    printf '  total %ss\n' "$total"
    sed 's/^summary: /  /' "$SUMMARY_NOTES"
    echo "=============================================================="
}

record() { # name result seconds
    STEP_NAMES+=("$1")
    STEP_RESULTS+=("$2")
    STEP_SECONDS+=("$3")
}

banner() { echo; echo "==> $*"; }

# run_step NAME CMD...: runs CMD; on failure prints the summary and exits.
run_step() {
    local name=$1
    shift
    banner "$name"
    local t0=$SECONDS
    if "$@"; then
        record "$name" PASS $((SECONDS - t0))
    else
        local rc=$?
        record "$name" FAIL $((SECONDS - t0))
        echo "test.sh: step '$name' failed (exit $rc)" >&2
        summary
        exit 1
    fi
}

FAILED_TARGETS=0
TARGET_LOG=$(mktemp)
# The last lines of every failing target, printed again just before the summary
# so that the end of the run says why it failed.
FAILURE_TAILS=$(mktemp)
# `summary: ...` lines a target prints (counts it reports), shown again in the summary.
SUMMARY_NOTES=$(mktemp)
trap 'rm -f "$TARGET_LOG" "$FAILURE_TAILS" "$SUMMARY_NOTES"' EXIT
# run_target [--must-run-tests] NAME TIMEOUT CMD...: runs CMD under a timeout
# and records the result. With --must-run-tests a target whose binary ran no
# test at all counts as failed (an empty target proves nothing).
run_target() {
    local must_run=0
    if [ "$1" = "--must-run-tests" ]; then
        must_run=1
        shift
    fi
    local name=$1 limit=$2
    shift 2
    banner "$name"
    local t0=$SECONDS rc=0
    # timeout runs the command in its own process group and kills the whole
    # group (cargo and the test binary) when the limit is reached.
    timeout -k 30 "$limit" "$@" 2>&1 | tee "$TARGET_LOG"
    rc=${PIPESTATUS[0]}
    # Count cargo's per-binary results for the closing line.
    local p f
    while read -r p f; do
        TESTS_PASSED=$((TESTS_PASSED + p))
        TESTS_FAILED=$((TESTS_FAILED + f))
    done < <(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' "$TARGET_LOG")
    grep '^summary: ' "$TARGET_LOG" >>"$SUMMARY_NOTES"
    if [ "$rc" -eq 0 ] && [ "$must_run" -eq 1 ] && grep -qx 'running 0 tests' "$TARGET_LOG"; then
        echo "test.sh: '$name' ran no tests" >&2
        rc=1
    fi
    if [ "$rc" -eq 0 ]; then
        record "$name" PASS $((SECONDS - t0))
    else
        [ "$rc" -eq 124 ] && echo "test.sh: '$name' timed out after ${limit}s" >&2
        record "$name" FAIL $((SECONDS - t0))
        FAILED_TARGETS=$((FAILED_TARGETS + 1))
        {
            echo "---- $name: last 60 lines of its output ----"
            tail -n 60 "$TARGET_LOG"
            echo
        } >>"$FAILURE_TAILS"
    fi
}

wanted() { # is this target selected by the command-line filter?
    [ "${#FILTER[@]}" -eq 0 ] && return 0
    local f
    for f in "${FILTER[@]}"; do [ "$f" = "$1" ] && return 0; done
    return 1
}

[ "$(id -u)" -eq 0 ] || { echo "test.sh: must run as root (FUSE mounts, dockerd, apt)" >&2; exit 1; }

# --- setup and lint (fail fast) -------------------------------------------------
run_step "install dependencies" bash scripts/install-deps.sh
run_step "cargo fmt --check" cargo fmt --all -- --check
run_step "cargo clippy -D warnings" cargo clippy --locked --workspace --all-targets -- -D warnings
run_step "shellcheck" shellcheck scripts/*.sh .ci/run packaging/sandbox-image/*.sh

start_docker() {
    local out
    out=$(timeout -k 10 900 bash scripts/docker.sh) || return 1
    eval "$out"
    [ -n "${SCOPEFS_TEST_DOCKER_IMAGE:-}" ] || { echo "docker.sh did not set SCOPEFS_TEST_DOCKER_IMAGE" >&2; return 1; }
    [ -n "${SCOPEFS_TEST_PYTHON_IMAGE:-}" ] || { echo "docker.sh did not set SCOPEFS_TEST_PYTHON_IMAGE" >&2; return 1; }
    export SCOPEFS_TEST_DOCKER_IMAGE SCOPEFS_TEST_PYTHON_IMAGE
    echo "SCOPEFS_TEST_DOCKER_IMAGE=$SCOPEFS_TEST_DOCKER_IMAGE SCOPEFS_TEST_PYTHON_IMAGE=$SCOPEFS_TEST_PYTHON_IMAGE"
}
run_step "docker engine + test image" start_docker

start_garage() {
    [ -f scripts/garage.sh ] || { echo "scripts/garage.sh is missing" >&2; return 1; }
    # The first start builds Garage (cargo install, ~7 min on 2 cores).
    timeout -k 10 1800 bash scripts/garage.sh start || return 1
    local out
    out=$(timeout -k 10 120 bash scripts/garage.sh env) || return 1
    eval "$out"
    local v missing=0
    for v in SCOPEFS_TEST_S3_ENDPOINT SCOPEFS_TEST_S3_REGION SCOPEFS_TEST_S3_BUCKET \
        SCOPEFS_TEST_S3_ACCESS_KEY_ID SCOPEFS_TEST_S3_SECRET_ACCESS_KEY SCOPEFS_TEST_GARAGE_CONFIG; do
        if [ -z "${!v:-}" ]; then
            echo "scripts/garage.sh env did not set $v" >&2
            missing=1
        else
            # shellcheck disable=SC2163
            export "$v"
        fi
    done
    [ "$missing" -eq 0 ] || return 1
    echo "Garage S3 at $SCOPEFS_TEST_S3_ENDPOINT, bucket $SCOPEFS_TEST_S3_BUCKET"
}
run_step "garage (S3 server)" start_garage

start_postgres() {
    timeout -k 10 600 bash scripts/postgres.sh start || return 1
    local out
    out=$(bash scripts/postgres.sh env) || return 1
    # Kept apart: only the registry-backends step (and tests that ask for it) use PostgreSQL.
    REGISTRY_POSTGRES_URL=$(sed -n 's/^export SCOPEFS_TEST_POSTGRES_URL=//p' <<<"$out")
    [ -n "$REGISTRY_POSTGRES_URL" ] || { echo "scripts/postgres.sh env printed no URL" >&2; return 1; }
    # The several-node tests run their daemons on it (each in a schema of its own).
    export SCOPEFS_TEST_NODES_POSTGRES_URL="$REGISTRY_POSTGRES_URL"
}
run_step "postgresql (registry backend)" start_postgres

run_step "build test binaries" cargo test --locked --workspace --no-run
# Debian package: cargo deb, dpkg -i, installed files, systemd-analyze verify (issue 6 a).
if wanted package; then
    run_target "debian package (scripts/package-test.sh)" "$TARGET_TIMEOUT" bash scripts/package-test.sh
fi

# --- tests (every target runs; failures are collected) ----------------------------
if wanted unit; then
    run_target "unit tests (lib + bins)" "$TARGET_TIMEOUT" cargo test --locked --workspace --lib --bins
fi
if wanted doc; then
    run_target "doctests" "$TARGET_TIMEOUT" cargo test --locked --workspace --doc
fi
if wanted registry_backends; then
    run_target "registry + billing on SQLite and PostgreSQL" "$TARGET_TIMEOUT" \
        bash scripts/registry-suites.sh "$REGISTRY_POSTGRES_URL"
fi

TARGETS=$(cargo metadata --locked --format-version 1 --no-deps |
    jq -r '.packages[] | .name as $p | .targets[] | select(.kind | index("test")) | "\($p) \(.name)"') || {
    echo "test.sh: cargo metadata failed" >&2
    summary
    exit 1
}
[ -n "$TARGETS" ] || { echo "test.sh: no integration test targets found" >&2; summary; exit 1; }

while read -r _ target; do
    wanted "$target" || continue
    case "$HEAVY_TARGETS" in
    *" $target "*)
        run_target --must-run-tests "$target (serial)" "$HEAVY_TIMEOUT" \
            cargo test --locked --workspace --test "$target" -- --test-threads=1 --nocapture
        ;;
    *)
        extra_args=()
        case "$REPORTING_TARGETS" in *" $target "*) extra_args=(-- --nocapture) ;; esac
        run_target --must-run-tests "$target" "$TARGET_TIMEOUT" cargo test --locked --workspace --test "$target" "${extra_args[@]}"
        ;;
    esac
done <<<"$TARGETS"

for f in "${FILTER[@]}"; do
    case "$f" in unit | doc | package | registry_backends) continue ;; esac
    if ! grep -qx "[^ ]* $f" <<<"$TARGETS"; then
        echo "test.sh: no test target named '$f'" >&2
        record "$f (no such target)" FAIL 0
        FAILED_TARGETS=$((FAILED_TARGETS + 1))
    fi
done

if [ "$FAILED_TARGETS" -gt 0 ]; then
    echo
    echo "==================== failing targets, again ===================="
    cat "$FAILURE_TAILS"
fi
summary
if [ "$FAILED_TARGETS" -gt 0 ]; then
    echo "test.sh: FAILED ($FAILED_TARGETS failing targets)" >&2
    # Counts of tests as cargo reported them; a target can fail without a failed test (a timeout, a
    # build error, no test run), so the targets are counted apart.
    echo "tests: $TESTS_PASSED passed, $TESTS_FAILED failed; targets: $FAILED_TARGETS failed"
    exit 1
fi
echo "test.sh: all tests passed"
echo "tests: $TESTS_PASSED passed, $TESTS_FAILED failed"
