#!/usr/bin/env bash
# The write path to S3, side by side: W1 (one file written sequentially, fsync at the end) and W7
# (--streams files written at once, each fsynced) of `scopefs bench`, on scopefs over Garage and on
# s3fs over the same Garage, the two targets alternated --rounds times (each round starts both from
# a fresh bucket and a quiet Garage: scripts/bench-compare.sh). Prints every round and the medians
# with the throughput ratio scopefs/s3fs (above 1.00: scopefs writes faster).
#
#   bash scripts/bench-s3-write.sh [--size-mib 512] [--streams 8] [--rounds 5]
#
# SCOPEFS_BENCH_ENV works as in bench-compare.sh (e.g. SCOPEFS_EARLY_UPLOAD=false to measure
# without early uploads). Needs what bench-compare.sh needs (root, a release build, s3fs, Garage).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIZE_MIB=512
STREAMS=8
ROUNDS=5
while [ $# -gt 0 ]; do
    case $1 in
    --size-mib) SIZE_MIB=$2; shift 2 ;;
    --streams) STREAMS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) echo "bench-s3-write: unknown argument $1" >&2; exit 2 ;;
    esac
done
OUT=${BENCH_DIR:-/tmp/scopefs-bench-compare}/s3-write
rm -rf "$OUT"
mkdir -p "$OUT"

for ((round = 1; round <= ROUNDS; round++)); do
    for target in scopefs-garage s3fs; do
        # bench-compare.sh empties its results directory first: one directory per target and round.
        RESULTS="$OUT/$round/$target" TARGETS=$target bash "$REPO/scripts/bench-compare.sh" \
            --only W1,W7 --size-mib "$SIZE_MIB" --streams "$STREAMS" >"$OUT/$round-$target.log" 2>&1 ||
            { echo "bench-s3-write: round $round of $target failed (log: $OUT/$round-$target.log)" >&2; exit 1; }
    done
done

python3 - "$OUT" "$ROUNDS" "$SIZE_MIB" "$STREAMS" <<'EOF'
import json, statistics, sys
out, rounds, size, streams = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
secs = {}
for r in range(1, rounds + 1):
    line = [f"round {r}:"]
    for t in ("scopefs-garage", "s3fs"):
        rows = json.load(open(f"{out}/{r}/{t}/{t}.json"))["rows"]
        for row in rows:
            secs.setdefault((t, row["workload"]), []).append(row["seconds"])
            line.append(f"{t} {row['workload']} {row['seconds']:.2f} s")
    print("  ".join(line))
print(f"\nmedians of {rounds} rounds, {size} MiB (W7: {streams} streams of {int(size) // int(streams)} MiB):")
for w, what in (("W1", "one stream"), ("W7", f"{streams} streams")):
    a = statistics.median(secs[("scopefs-garage", w)])
    b = statistics.median(secs[("s3fs", w)])
    mib = int(size)
    print(f"{w} ({what}): scopefs {a:.2f} s ({mib / a:.0f} MiB/s), s3fs {b:.2f} s ({mib / b:.0f} MiB/s), "
          f"throughput scopefs/s3fs {b / a:.2f}")
EOF
