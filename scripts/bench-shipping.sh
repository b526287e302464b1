#!/usr/bin/env bash
# What shipping each scope's metadata to the bucket costs (metadata_shipping):
#   1. W1–W8 of `scopefs bench` on scopefs over Garage with metadata_shipping on and with it off
#      (scripts/bench-compare.sh, same arguments), --rounds rounds of each, alternated (on first in
#      odd rounds, off first in even ones), with the page cache written back and --settle seconds of
#      quiet before each run (Garage digests the previous run's puts and deletes meanwhile); each step's median per setting, and
#      the ratio on/off of the medians (time); and each workload's CPU seconds, the daemon's and
#      Garage's (the cost shipping adds, which wall time on 2 cores blurs: both settings upload
#      the same blocks in the background while the next workloads run);
#   2. the metadata objects and bytes shipped per 1,000 files created (W3 into one scope of a fresh
#      daemon: /metrics before and after, every batch shipped);
#   3. the time `scopefs restore --scope ID` takes to rebuild that scope (its --files files) into an
#      empty data directory from the bucket alone, and the first listing of its mount after;
#   4. (before 3.) the latency of `fsync` of a new 4 KiB file on that scope: p50, p99, max.
#
#   bash scripts/bench-shipping.sh [--size-mib 256] [--files 10000] [--rounds 3] [--settle 15]
#                                  [--only w3,w4,w5,w6]
#
# Needs what bench-compare.sh needs (root, a release build, Garage).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${SCOPEFS_BIN:-$REPO/target/release/scopefs}
SIZE_MIB=256
FILES=10000
ROUNDS=3
SETTLE=15
ONLY=()
while [ $# -gt 0 ]; do
    case $1 in
    --size-mib) SIZE_MIB=$2; shift 2 ;;
    --files) FILES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --settle) SETTLE=$2; shift 2 ;;
    --only) ONLY=(--only "$2"); shift 2 ;;
    *) echo "bench-shipping: unknown argument $1" >&2; exit 2 ;;
    esac
done
OUT=${BENCH_DIR:-/tmp/scopefs-bench-compare}/shipping
rm -rf "$OUT"
mkdir -p "$OUT"
die() {
    echo "bench-shipping: $*" >&2
    exit 1
}

# 1. The workloads with and without shipping, alternated.
for ((round = 1; round <= ROUNDS; round++)); do
    order="on off"
    [ $((round % 2)) -eq 0 ] && order="off on"
    for mode in $order; do
        flag=true
        [ "$mode" = off ] && flag=false
        sync
        sleep "$SETTLE"
        RESULTS="$OUT/$mode-$round" TARGETS=scopefs-garage SCOPEFS_BENCH_ENV="SCOPEFS_METADATA_SHIPPING=$flag" \
            bash "$REPO/scripts/bench-compare.sh" --size-mib "$SIZE_MIB" --files "$FILES" "${ONLY[@]}" \
            >"$OUT/$mode-$round.log" 2>&1 ||
            die "the workloads with shipping $mode failed (log: $OUT/$mode-$round.log)"
    done
done
python3 - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
reports = {m: [json.load(open(f"{out}/{m}-{r}/scopefs-garage.json")) for r in range(1, rounds + 1)]
           for m in ("on", "off")}
runs = {m: [rep["rows"] for rep in reports[m]] for m in reports}
print(f"medians of {rounds} alternated rounds")
print("| step | shipping on (s) | off (s) | on/off |")
print("| --- | --- | --- | --- |")
for i, row in enumerate(runs["on"][0]):
    on = statistics.median(r[i]["seconds"] for r in runs["on"])
    off = statistics.median(r[i]["seconds"] for r in runs["off"])
    ratio = on / off if off > 0 else float("nan")
    print(f"| {row['workload']} {row['name']} | {on:.3f} | {off:.3f} | {ratio:.2f} |")
# CPU seconds each workload cost the daemon and Garage (wall time on 2 cores also carries the
# upload backlog both settings share; CPU time is the cost shipping adds).
if all(rep.get("cpu") for m in reports for rep in reports[m]):
    print()
    print(f"CPU seconds, medians of {rounds} rounds: daemon + Garage (daemon, Garage)")
    print("| workload | shipping on | off | on/off |")
    print("| --- | --- | --- | --- |")
    for i, w in enumerate(reports["on"][0]["cpu"]):
        cost = {m: [rep["cpu"][i]["seconds"] for rep in reports[m]] for m in reports}
        med = {m: [statistics.median(c[k] for c in cost[m]) for k in range(len(cost[m][0]))] for m in cost}
        total = {m: statistics.median(sum(c) for c in cost[m]) for m in cost}
        parts = {m: ", ".join(f"{x:.2f}" for x in med[m]) for m in med}
        ratio = total["on"] / total["off"] if total["off"] > 0 else float("nan")
        print(f"| {w['workload']} | {total['on']:.2f} ({parts['on']}) | {total['off']:.2f} ({parts['off']}) | {ratio:.2f} |")
EOF

# 2. and 3.: one daemon, one scope, W3 into it; then its data directory goes and restore rebuilds it.
eval "$(bash "$REPO/scripts/garage.sh" env)"
GARAGE=$(command -v garage || echo "$HOME/.cargo/bin/garage")
timeout 60 "$GARAGE" -c "$SCOPEFS_TEST_GARAGE_CONFIG" bucket create shipping-bench >/dev/null 2>&1 || true
timeout 60 "$GARAGE" -c "$SCOPEFS_TEST_GARAGE_CONFIG" bucket allow --read --write --owner shipping-bench \
    --key "$SCOPEFS_TEST_S3_ACCESS_KEY_ID" >/dev/null
D="$OUT/daemon"
mkdir -p "$D"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf 'data_dir = "%s/data"\nmount_root = "%s/mnt"\nlisten = "127.0.0.1:%s"\nservice_token = "bench"\nquota_bytes = 68719476736\n' \
    "$D" "$D" "$PORT" >"$D/scopefs.toml"
PREFIX="run-$(date +%s)"
export SCOPEFS_S3_ENDPOINT="$SCOPEFS_TEST_S3_ENDPOINT" SCOPEFS_S3_REGION=garage SCOPEFS_S3_BUCKET=shipping-bench \
    SCOPEFS_S3_PREFIX="$PREFIX" SCOPEFS_S3_ACCESS_KEY_ID="$SCOPEFS_TEST_S3_ACCESS_KEY_ID" \
    SCOPEFS_S3_SECRET_ACCESS_KEY="$SCOPEFS_TEST_S3_SECRET_ACCESS_KEY"
DAEMON_PID=""
cleanup() {
    if [ -n "$DAEMON_PID" ]; then kill -TERM "$DAEMON_PID" 2>/dev/null || true; wait "$DAEMON_PID" 2>/dev/null || true; fi
}
trap cleanup EXIT
start() {
    SCOPEFS_LOG=warn "$BIN" --config "$D/scopefs.toml" serve >>"$D/daemon.log" 2>&1 &
    DAEMON_PID=$!
    local i
    for ((i = 0; i < 600; i++)); do
        curl -fs -o /dev/null "http://127.0.0.1:$PORT/ready" && return 0
        kill -0 "$DAEMON_PID" 2>/dev/null || die "the daemon exited (log: $D/daemon.log)"
        sleep 0.1
    done
    die "the daemon was not ready within 60 s (log: $D/daemon.log)"
}
stop() {
    kill -TERM "$DAEMON_PID"
    wait "$DAEMON_PID" || true
    DAEMON_PID=""
}
shipped() { # objects bytes
    curl -fsS -H 'Authorization: Bearer bench' "http://127.0.0.1:$PORT/metrics" |
        awk '$1 == "scopefs_metadata_shipped_objects_total" { o = $2 } $1 == "scopefs_metadata_shipped_bytes_total" { b = $2 } END { print o, b }'
}
start
SCOPE=$(curl -fsS -H 'Authorization: Bearer bench' -H 'content-type: application/json' \
    -d '{"operation_id":"shipping","primary_thread_id":"shipping"}' \
    "http://127.0.0.1:$PORT/internal/workspace-scopes/provision" | python3 -c 'import json,sys; print(json.load(sys.stdin)["scope_id"])')
MNT="$D/mnt/$SCOPE"
mountpoint -q "$MNT" || die "$MNT is not mounted"
read -r O0 B0 < <(shipped)
"$BIN" bench "$MNT" --only W3 --files "$FILES" --keep --json >"$OUT/w3.json"
# Everything committed is shipped within metadata_sync_interval_ms (1 s): fsync of the scope's root
# waits for it, so the counters below hold every batch W3 committed.
python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)" "$MNT"
read -r O1 B1 < <(shipped)
# 4. fsync of a 4 KiB file on Garage with shipping on: each returns once the file's block and every
# batch the scope committed before it are in the bucket (issue 23 g: p50, p99).
python3 - "$MNT/fsync-latency" <<'EOF'
import os, statistics, sys, time
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
data = os.urandom(4088)
ms = []
for i in range(300):
    fd = os.open(f"{d}/f{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, data + i.to_bytes(8, "little"))
    t = time.perf_counter()
    os.fsync(fd)
    ms.append((time.perf_counter() - t) * 1000)
    os.close(fd)
ms.sort()
q = statistics.quantiles(ms, n=100)
print(f"fsync of a 4 KiB file ({len(ms)} files, each a new block): p50 {q[49]:.1f} ms, p99 {q[98]:.1f} ms, max {ms[-1]:.1f} ms")
EOF
stop
python3 - "$O0" "$B0" "$O1" "$B1" "$FILES" <<'EOF'
import sys
o0, b0, o1, b1, files = (float(x) for x in sys.argv[1:])
per = 1000.0 / files
print(f"\nshipped for {int(files)} files created (W3: create, 4 KiB write, close; 100 directories): "
      f"{int(o1 - o0)} objects, {int(b1 - b0)} bytes; per 1,000 files: {(o1 - o0) * per:.1f} objects, "
      f"{(b1 - b0) * per / 1024:.1f} KiB")
EOF
rm -rf --one-file-system "$D/data"
start_ns=$(date +%s%N)
"$BIN" --config "$D/scopefs.toml" restore --scope "$SCOPE" >"$OUT/restore.log" 2>&1 || die "restore failed (log: $OUT/restore.log)"
end_ns=$(date +%s%N)
echo "restore --scope of the scope with $FILES files and the 300 of step 4 (registry included): $(( (end_ns - start_ns) / 1000000 )) ms: $(tail -n1 "$OUT/restore.log")"
start
start_ns=$(date +%s%N)
n=$(find "$MNT" -type f | wc -l)
end_ns=$(date +%s%N)
echo "after the restore: a fresh daemon lists $n files through the mount in $(( (end_ns - start_ns) / 1000000 )) ms"
stop
