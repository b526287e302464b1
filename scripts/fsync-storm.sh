#!/bin/bash
# A neighbour's view of an fsync storm (issue 22 N1): starts `scopefs serve` on the local store in a
# fresh directory, mounts two scopes, measures a bystander's small write+stat in scope B (3 s quiet,
# then during the storm) while 16 `dd conv=fsync` writers fill scope A, and prints p50/p99/max.
#
#   bash scripts/fsync-storm.sh [--bin PATH] [--share N|none] [--mib MiB-per-writer] [--rounds N]
#                               [--writer-nice N] [--load storm|cpu-user|cpu-kernel]
#
# --share sets fuse.max_workers_per_mount (none: leave it out, for binaries without the key).
# --writer-nice runs the writers at that niceness (0: as the probe), as a container's lower CPU
# weight would: it separates the CPU the writers take themselves from what the daemon does.
# --load replaces the storm by a control that asks nothing of the daemon: 16 processes burning CPU
# in user space (`yes`) or in the kernel (`dd if=/dev/urandom of=/dev/null`), for 4 s a round, at
# --writer-nice. Each run also prints the bystander's open, write, close and stat apart (a stat
# answered from the kernel's cache measures the probe's own wait for a CPU).
set -euo pipefail
BIN=target/release/scopefs; SHARE=8; MIB=120; ROUNDS=2; NICE=0; LOAD=storm
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --share) SHARE=$2; shift 2 ;;
    --mib) MIB=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --writer-nice) NICE=$2; shift 2 ;;
    --load) LOAD=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
case "$LOAD" in storm|cpu-user|cpu-kernel) ;; *) echo "unknown --load $LOAD" >&2; exit 2 ;; esac
[ -x "$BIN" ] || { echo "no scopefs binary at $BIN (cargo build --release -p scopefs-daemon)" >&2; exit 1; }
D=$(mktemp -d /tmp/scopefs-storm.XXXX)
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
cat > "$D/scopefs.toml" <<CFG
data_dir = "$D/data"
mount_root = "$D/mnt"
listen = "127.0.0.1:$PORT"
[store]
kind = "local"
CFG
if [ "$SHARE" != none ]; then printf '[fuse]\nmax_workers_per_mount = %s\n' "$SHARE" >> "$D/scopefs.toml"; fi
"$BIN" --config "$D/scopefs.toml" serve > "$D/serve.log" 2>&1 &
SERVE=$!
cleanup() { kill -TERM "$SERVE" 2>/dev/null; wait "$SERVE" 2>/dev/null || true; rm -rf "$D"; }
trap cleanup EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null && break; sleep 0.2; done
TOKEN=$(cat "$D/data/control/service-token")
api() { curl -sf -H "Authorization: Bearer $TOKEN" -H 'content-type: application/json' "$@"; }
mount_of() {
  local id
  id=$(api -d "{\"operation_id\":\"op-$1\",\"primary_thread_id\":\"$1\"}" \
    "http://127.0.0.1:$PORT/internal/workspace-scopes/provision" | python3 -c 'import sys,json;print(json.load(sys.stdin)["scope_id"])')
  api "http://127.0.0.1:$PORT/internal/workspace-scopes/$id/mount" | python3 -c 'import sys,json;print(json.load(sys.stdin)["bind_source"])'
}
A=$(mount_of storm-a); B=$(mount_of storm-b)
python3 - "$A" "$B" "$MIB" "$ROUNDS" "$NICE" "$LOAD" <<'PY'
import os, subprocess, sys, threading, time
a, b, mib, rounds, nice, load = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
STEPS = ["open", "write", "close", "stat"]
def probe(stop, out):
    path = os.path.join(b, "probe")
    while not stop.is_set():
        t = [time.perf_counter()]
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            t.append(time.perf_counter())
            os.write(fd, b"x")
            t.append(time.perf_counter())
            os.close(fd)
            t.append(time.perf_counter())
            os.stat(path)
            t.append(time.perf_counter())
            out.append((t[-1] - t[0], [t[i + 1] - t[i] for i in range(4)]))
        except OSError:
            out.append((float("inf"), None))
        time.sleep(0.01)
def measure(work):
    out, stop = [], threading.Event()
    th = threading.Thread(target=probe, args=(stop, out))
    th.start()
    t0 = time.perf_counter()
    work()
    took = time.perf_counter() - t0
    stop.set()
    th.join()
    return out, took
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] * 1e3
def storm():
    commands = {
        "storm": lambda i: ["dd", "if=/dev/urandom", "of=%s/f%d" % (a, i), "bs=1M", "count=%d" % mib, "conv=fsync"],
        "cpu-user": lambda i: ["timeout", "4", "yes"],
        "cpu-kernel": lambda i: ["timeout", "4", "dd", "if=/dev/urandom", "of=/dev/null", "bs=1M"],
    }[load]
    for _ in range(rounds):
        ps = [subprocess.Popen(["nice", "-n", nice] + commands(i), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
              for i in range(16)]
        for p in ps:
            p.wait()
def line(name, xs):
    failed = sum(1 for x, _ in xs if x == float("inf"))
    ok = [x for x, _ in xs if x != float("inf")]
    steps = [parts for x, parts in xs if parts is not None]
    apart = ", ".join("%s p99 %.1f ms" % (s, pct([p[i] for p in steps], .99)) for i, s in enumerate(STEPS))
    return "%s: %d probes, p50 %.1f ms, p99 %.1f ms, max %.1f ms, %d failed (%s)" % (
        name, len(xs), pct(ok, .5), pct(ok, .99), max(ok) * 1e3, failed, apart)
quiet, _ = measure(lambda: time.sleep(3))
stormy, took = measure(storm)
what = {"storm": "16 x %d MiB conv=fsync" % mib, "cpu-user": "16 x yes, 4 s", "cpu-kernel": "16 x dd urandom to /dev/null, 4 s"}[load]
print(line("quiet", quiet))
print(line("%s (%d rounds of %s, at nice %s, %.1f s)" % (load, rounds, what, nice, took), stormy))
PY
