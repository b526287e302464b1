//! The real-tool suite: venv + pip, git, a hard-link store, SQLite WAL, shared mmap, make + cc, locks, xattrs, fallocate, open-file rename/unlink and untar + rm -rf, run as the sandbox user on a scope mount.
//!
//! Every test mounts its own scope, gives it to the default sandbox uid (2000000000) and reaches
//! it through a bind of the real mount, as a container does. Each step is a shell script run as
//! that user; the first failing step fails the test with the step's name and the tools' stderr.

#[path = "support/fuse_harness.rs"]
pub mod harness;
#[path = "real_tools_support/mod.rs"]
pub mod rig;

use rig::{require_python_modules, Rig};

const PYTHON: (&str, &str) = ("python3", "python3");

#[test]
fn python_venv_with_symlinked_interpreter_and_local_wheel() {
    require_python_modules(&[("venv", "python3-venv"), ("ensurepip", "python3-venv"), ("zipfile", "python3")]);
    let rig = Rig::new(&[PYTHON]);
    rig.step(
        "python3 -m venv (default: symlinked interpreter)",
        r#"
        python3 -m venv venv
        [ -L venv/bin/python3 ] || fail "venv/bin/python3 is not a symlink: venv fell back to copying"
        target=$(readlink venv/bin/python3)
        case "$target" in /*) ;; *) fail "venv/bin/python3 -> $target is not absolute" ;; esac
        [ -x venv/bin/pip ] || fail "the venv has no pip"
        "#,
    );
    let prefix = rig.step(
        "run the venv's python",
        r#"venv/bin/python -c 'import sys; assert sys.prefix != sys.base_prefix, "not in a venv"; print(sys.prefix)'"#,
    );
    assert!(prefix.trim().ends_with("/work/venv"), "venv python reports prefix {prefix:?}");
    rig.step(
        "build a pure-python wheel by hand (no network)",
        r#"
        mkdir dist
        python3 - <<'EOF'
import base64, hashlib, zipfile
name, ver = "realtools_demo", "1.0"
di = f"{name}-{ver}.dist-info"
files = {
    f"{name}/__init__.py": "def answer():\n    return 42\n\ndef main():\n    print('demo', answer())\n",
    f"{di}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\nSummary: real-tool suite demo\n",
    f"{di}/WHEEL": "Wheel-Version: 1.0\nGenerator: real_tools\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    f"{di}/entry_points.txt": f"[console_scripts]\nrealtools-demo = {name}:main\n",
    f"{di}/top_level.txt": f"{name}\n",
}
record = []
with zipfile.ZipFile(f"dist/{name}-{ver}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as z:
    for path, text in files.items():
        data = text.encode()
        z.writestr(path, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{di}/RECORD,,")
    z.writestr(f"{di}/RECORD", "\n".join(record) + "\n")
EOF
        [ -s dist/realtools_demo-1.0-py3-none-any.whl ] || fail "no wheel written"
        "#,
    );
    rig.step(
        "pip install --no-index of the local wheel",
        "venv/bin/pip install --no-index --no-cache-dir dist/realtools_demo-1.0-py3-none-any.whl",
    );
    let out = rig.step(
        "import the installed package and run its console script",
        r#"
        venv/bin/python -c 'import realtools_demo; assert realtools_demo.answer() == 42; print(realtools_demo.__file__)'
        venv/bin/realtools-demo
        venv/bin/pip show realtools_demo | grep -q '^Version: 1.0$' || fail "pip show lacks Version 1.0"
        "#,
    );
    assert!(out.contains("/venv/lib/python3") && out.contains("demo 42"), "unexpected output: {out}");
    rig.step(
        "pip uninstall",
        r#"
        venv/bin/pip uninstall -y realtools_demo
        if venv/bin/python -c 'import realtools_demo' 2>/dev/null; then fail "still importable after uninstall"; fi
        [ ! -e venv/bin/realtools-demo ] || fail "console script left behind"
        "#,
    );
}

#[test]
fn git_init_commit_gc_clone_and_checkout() {
    let rig = Rig::new(&[("git", "git")]);
    rig.step(
        "git init/add/commit",
        r#"
        git -c init.defaultBranch=main init -q repo
        cd repo
        mkdir -p src/deep/er
        printf 'version one\n' > file.txt
        i=0; while [ $i -lt 50 ]; do printf 'module %s\n' $i > src/m$i.txt; i=$((i+1)); done
        printf '#!/bin/sh\necho hi\n' > src/deep/er/run.sh; chmod +x src/deep/er/run.sh
        ln -s ../file.txt src/link
        git add -A
        git commit -q -m 'first'
        printf 'version two\n' > file.txt
        rm src/m7.txt
        git add -A
        git commit -q -m 'second'
        [ "$(git rev-list --count HEAD)" = 2 ] || fail "expected 2 commits"
        "#,
    );
    rig.step(
        "git gc + fsck",
        r#"
        cd repo
        git gc -q --prune=now
        ls .git/objects/pack/*.pack >/dev/null 2>&1 || fail "git gc wrote no pack"
        git fsck --full --strict
        [ -z "$(git status --porcelain)" ] || fail "status not clean after gc: $(git status --porcelain)"
        "#,
    );
    rig.step(
        "git clone of a local path (hard links)",
        r#"
        git clone -q repo clone-local
        pack=$(ls clone-local/.git/objects/pack/*.pack | head -n1)
        links=$(stat -c %h "$pack")
        [ "$links" -ge 2 ] || fail "clone-local's pack has $links link(s): git copied instead of hard-linking"
        [ "$(stat -c %i "$pack")" = "$(stat -c %i repo/.git/objects/pack/$(basename "$pack"))" ] ||
            fail "the clone's pack is not the same inode as the origin's"
        cd clone-local && git fsck --full --strict
        "#,
    );
    rig.step(
        "git clone --no-local",
        r#"
        git clone -q --no-local repo clone-copy
        cd clone-copy
        git fsck --full --strict
        [ "$(git rev-parse HEAD)" = "$(git -C ../repo rev-parse HEAD)" ] || fail "HEAD differs from origin"
        [ -z "$(git status --porcelain)" ] || fail "fresh clone not clean"
        "#,
    );
    rig.step(
        "git checkout of an older commit, status clean, back again",
        r#"
        cd clone-local
        git checkout -q HEAD~1
        [ "$(cat file.txt)" = "version one" ] || fail "file.txt at HEAD~1: $(cat file.txt)"
        [ -f src/m7.txt ] || fail "src/m7.txt not restored by checkout"
        [ "$(readlink src/link)" = "../file.txt" ] || fail "symlink not restored"
        [ -x src/deep/er/run.sh ] || fail "executable bit lost"
        [ -z "$(git status --porcelain)" ] || fail "status not clean at HEAD~1: $(git status --porcelain)"
        git checkout -q main
        [ "$(cat file.txt)" = "version two" ] || fail "file.txt at main: $(cat file.txt)"
        [ ! -e src/m7.txt ] || fail "src/m7.txt not removed by checkout"
        [ -z "$(git status --porcelain)" ] || fail "status not clean at main"
        "#,
    );
}

#[test]
fn hard_link_store_like_pnpm() {
    let rig = Rig::new(&[("ln", "coreutils"), ("cp", "coreutils"), ("stat", "coreutils"), PYTHON]);
    rig.step(
        "ln a store file into several dirs",
        r#"
        mkdir -p store/ab proj1/node_modules/pkg proj2/node_modules/pkg proj3/node_modules/pkg
        printf 'module.exports = 42;\n' > store/ab/cdef-index.js
        ln store/ab/cdef-index.js proj1/node_modules/pkg/index.js
        ln store/ab/cdef-index.js proj2/node_modules/pkg/index.js
        python3 -c 'import os; os.link("store/ab/cdef-index.js", "proj3/node_modules/pkg/index.js")'
        for f in store/ab/cdef-index.js proj1/node_modules/pkg/index.js proj3/node_modules/pkg/index.js; do
            [ "$(stat -c %h "$f")" = 4 ] || fail "$f has $(stat -c %h "$f") links, expected 4"
            [ "$(stat -c %i "$f")" = "$(stat -c %i store/ab/cdef-index.js)" ] || fail "$f is another inode"
        done
        "#,
    );
    rig.step(
        "content is shared between the names",
        r#"
        printf 'extra\n' >> proj1/node_modules/pkg/index.js
        cmp proj1/node_modules/pkg/index.js proj2/node_modules/pkg/index.js
        cmp proj1/node_modules/pkg/index.js store/ab/cdef-index.js
        [ "$(stat -c %s proj3/node_modules/pkg/index.js)" = 27 ] || fail "size seen through another name"
        "#,
    );
    rig.step(
        "unlink of one name keeps the others",
        r#"
        rm store/ab/cdef-index.js
        [ ! -e store/ab/cdef-index.js ] || fail "unlinked name still there"
        [ "$(stat -c %h proj2/node_modules/pkg/index.js)" = 3 ] || fail "nlink after unlink: $(stat -c %h proj2/node_modules/pkg/index.js)"
        [ "$(cat proj2/node_modules/pkg/index.js)" = "$(printf 'module.exports = 42;\nextra')" ] || fail "content lost"
        mv proj3/node_modules/pkg/index.js proj3/node_modules/pkg/renamed.js
        [ "$(stat -c %h proj1/node_modules/pkg/index.js)" = 3 ] || fail "nlink changed by rename"
        cmp proj3/node_modules/pkg/renamed.js proj1/node_modules/pkg/index.js
        "#,
    );
    rig.step(
        "cp -al of a tree",
        r#"
        cp -al proj1 proj1-copy
        [ "$(stat -c %h proj1-copy/node_modules/pkg/index.js)" = 4 ] || fail "cp -al: nlink $(stat -c %h proj1-copy/node_modules/pkg/index.js)"
        [ "$(stat -c %i proj1-copy/node_modules/pkg/index.js)" = "$(stat -c %i proj1/node_modules/pkg/index.js)" ] || fail "cp -al copied"
        rm -rf proj1 proj2 proj3
        [ "$(stat -c %h proj1-copy/node_modules/pkg/index.js)" = 1 ] || fail "last name: nlink $(stat -c %h proj1-copy/node_modules/pkg/index.js)"
        grep -q extra proj1-copy/node_modules/pkg/index.js || fail "content lost with the other names"
        "#,
    );
}

#[test]
fn sqlite_in_wal_mode() {
    require_python_modules(&[("sqlite3", "libpython3-stdlib")]);
    let rig = Rig::new(&[PYTHON, ("sqlite3", "sqlite3")]);
    let out = rig.step(
        "WAL database: transactions, a second reader, integrity_check",
        r#"
        python3 - <<'EOF'
import sqlite3, subprocess
db = sqlite3.connect("app.db", isolation_level=None)
mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
assert mode == "wal", f"journal_mode is {mode}"
db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, payload BLOB)")
db.execute("CREATE INDEX t_name ON t(name)")
for batch in range(20):
    db.execute("BEGIN")
    db.executemany("INSERT INTO t (name, payload) VALUES (?, ?)",
                   ((f"row-{batch}-{i}", bytes([i % 256]) * 200) for i in range(1000)))
    db.execute("COMMIT")
reader = sqlite3.connect("app.db")
assert reader.execute("SELECT count(*) FROM t").fetchone()[0] == 20000
# An open write transaction: another process still reads the committed state.
db.execute("BEGIN")
db.execute("DELETE FROM t WHERE id % 2 = 0")
other = subprocess.run(["sqlite3", "app.db", "SELECT count(*) FROM t"], capture_output=True, text=True, check=True)
assert other.stdout.strip() == "20000", f"second process saw {other.stdout!r} {other.stderr!r}"
db.execute("COMMIT")
assert reader.execute("SELECT count(*) FROM t").fetchone()[0] == 10000
for name in ("app.db-wal", "app.db-shm"):
    import os
    assert os.path.exists(name), f"{name} missing in WAL mode"
db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
ok = db.execute("PRAGMA integrity_check").fetchone()[0]
assert ok == "ok", ok
reader.close(); db.close()
print("python ok")
EOF
        [ "$(sqlite3 app.db 'PRAGMA integrity_check')" = ok ] || fail "sqlite3 CLI integrity_check"
        [ "$(sqlite3 app.db 'SELECT count(*) FROM t')" = 10000 ] || fail "row count after reopen"
        [ "$(sqlite3 app.db 'PRAGMA journal_mode')" = wal ] || fail "WAL mode not persistent"
        "#,
    );
    assert!(out.contains("python ok"), "{out}");
}

#[test]
fn shared_writable_mmap() {
    require_python_modules(&[("mmap", "python3")]);
    let rig = Rig::new(&[PYTHON]);
    rig.step(
        "write through a shared mapping, msync, read back with read(2)",
        r#"
        python3 - <<'EOF'
import mmap, os
size = 3 * 65536 + 1234
data = bytes((i * 7 + 3) % 251 for i in range(size))
fd = os.open("mapped.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.ftruncate(fd, size)
m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
m[:] = data
m[100:105] = b"HELLO"
m.flush()  # msync(MS_SYNC)
# A second process reads the file while the mapping is still alive.
other = os.popen("cat mapped.bin | od -An -c -j100 -N5").read().split()
assert other == list("HELLO"), other
m.close()
os.close(fd)
want = bytearray(data); want[100:105] = b"HELLO"
fd = os.open("mapped.bin", os.O_RDONLY)
got = b""
while True:
    chunk = os.read(fd, 65536)
    if not chunk:
        break
    got += chunk
os.close(fd)
assert got == bytes(want), "read(2) after reopen differs from what was written through the mapping"
assert os.stat("mapped.bin").st_size == size
# A write through read/write is seen by a new mapping.
with open("mapped.bin", "r+b") as f:
    f.seek(size - 4); f.write(b"TAIL")
with open("mapped.bin", "rb") as f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    assert m[size - 4:] == b"TAIL"
    m.close()
EOF
        "#,
    );
}

#[test]
fn make_and_cc() {
    let rig = Rig::new(&[("make", "make"), ("cc", "gcc")]);
    rig.step(
        "write a small C project with a Makefile",
        r#"
        mkdir proj && cd proj
        printf 'int add(int a, int b);\n' > util.h
        printf '#include "util.h"\nint add(int a, int b) { return a + b; }\n' > util.c
        printf '#include <stdio.h>\n#include "util.h"\nint main(void) { printf("sum=%%d\\n", add(40, 2)); return 0; }\n' > main.c
        printf 'CC ?= cc\nall: hello\nhello: main.o util.o\n\t$(CC) -o $@ main.o util.o\n%%.o: %%.c util.h\n\t$(CC) -O2 -Wall -Werror -c -o $@ $<\nclean:\n\trm -f hello *.o\n.PHONY: all clean\n' > Makefile
        "#,
    );
    let out = rig.step("make + run", "cd proj && make && ./hello");
    assert!(out.contains("sum=42"), "program output: {out}");
    rig.step(
        "make again: nothing to do",
        r#"
        cd proj
        make -q || fail "make -q says the tree is out of date right after a build"
        out=$(make)
        case "$out" in *"Nothing to be done"*|*"is up to date"*) ;; *) fail "second make rebuilt: $out" ;; esac
        "#,
    );
    rig.step(
        "touch one source: only its object is rebuilt",
        r#"
        cd proj
        touch util.c
        out=$(make)
        case "$out" in *util.o*) ;; *) fail "util.o not rebuilt: $out" ;; esac
        case "$out" in *"-o main.o"*) fail "main.o rebuilt needlessly: $out" ;; esac
        [ "$(./hello)" = "sum=42" ] || fail "relinked program output"
        make clean
        [ ! -e hello ] && [ ! -e util.o ] || fail "make clean left files"
        "#,
    );
}

#[test]
fn flock_and_fcntl_locks_contend() {
    require_python_modules(&[("fcntl", "python3")]);
    let rig = Rig::new(&[("flock", "util-linux"), PYTHON]);
    rig.step(
        "flock(1): a held lock refuses a second process, a waiter runs after release",
        r#"
        : > lock
        : > log
        exec 3> lock
        flock -x 3
        if flock -n lock true; then fail "a second flock -n got the lock while it was held"; fi
        if flock -s -n lock true; then fail "a shared flock -n got the lock while an exclusive one was held"; fi
        flock -x lock sh -c 'echo waiter >> log' &
        waiter=$!
        echo holder >> log
        flock -u 3
        wait $waiter || fail "the blocked waiter failed"
        [ "$(cat log)" = "$(printf 'holder\nwaiter')" ] || fail "order: $(cat log)"
        flock -n lock true || fail "lock not free after both released"
        exec 3>&-
        # Shared locks coexist.
        exec 4< lock
        flock -s 4
        flock -s -n lock true || fail "a second shared lock was refused"
        if flock -x -n lock true; then fail "an exclusive lock was granted over a shared one"; fi
        exec 4<&-
        "#,
    );
    rig.step(
        "lockf/fcntl: byte ranges contend between two processes",
        r#"
        python3 - <<'EOF'
import fcntl, os, subprocess, sys
with open("ranges", "wb") as f:
    f.write(b"\0" * 4096)
f = open("ranges", "r+b")
fcntl.lockf(f, fcntl.LOCK_EX, 100, 0)          # bytes 0..99
probe = """
import fcntl, sys
f = open("ranges", "r+b")
start, length = int(sys.argv[1]), int(sys.argv[2])
try:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, length, start)
except OSError:
    print("busy")
else:
    print("got")
"""
def probe_range(start, length):
    return subprocess.run([sys.executable, "-c", probe, str(start), str(length)],
                          capture_output=True, text=True, check=True).stdout.strip()
assert probe_range(50, 10) == "busy", "overlapping lockf granted to a second process"
assert probe_range(200, 10) == "got", "a disjoint range was refused"
# F_GETLK (through fcntl) reports the holder's pid to the other process.
getlk = subprocess.run([sys.executable, "-c", """
import fcntl, struct
f = open("ranges", "r+b")
req = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 10, 0)
res = fcntl.fcntl(f, fcntl.F_GETLK, req)
print(struct.unpack("hhqqi", res)[4])
"""], capture_output=True, text=True, check=True).stdout.strip()
assert getlk == str(os.getpid()), f"F_GETLK reported pid {getlk}, holder is {os.getpid()}"
fcntl.lockf(f, fcntl.LOCK_UN, 100, 0)
assert probe_range(50, 10) == "got", "range still locked after LOCK_UN"
# A blocking waiter acquires once the holder's process closes the file.
fcntl.lockf(f, fcntl.LOCK_EX)
waiter = subprocess.Popen([sys.executable, "-c", "import fcntl; f = open('ranges', 'r+b'); fcntl.lockf(f, fcntl.LOCK_EX); print('acquired')"],
                          stdout=subprocess.PIPE, text=True)
f.close()
out, _ = waiter.communicate(timeout=120)
assert waiter.returncode == 0 and out.strip() == "acquired", (waiter.returncode, out)
print("locks ok")
EOF
        "#,
    );
}

#[test]
fn user_xattrs_round_trip() {
    let rig = Rig::new(&[("setfattr", "attr"), ("getfattr", "attr")]);
    rig.step(
        "setfattr/getfattr user.* on a file and a directory",
        r#"
        printf 'data' > f
        mkdir d
        setfattr -n user.mime_type -v text/plain f
        setfattr -n user.empty f
        setfattr -n user.bin -v 0x00ff10 f
        setfattr -n user.comment -v 'a directory' d
        [ "$(getfattr --only-values -n user.mime_type f)" = text/plain ] || fail "user.mime_type value"
        [ "$(getfattr -e hex -n user.bin f | grep '^user.bin=')" = 'user.bin=0x00ff10' ] || fail "binary value"
        [ "$(getfattr --only-values -n user.comment d)" = 'a directory' ] || fail "directory xattr"
        names=$(getfattr -d -m '^user\.' f | grep '^user\.' | cut -d= -f1 | sort | tr '\n' ' ')
        [ "$names" = 'user.bin user.empty user.mime_type ' ] || fail "listed names: $names"
        "#,
    );
    rig.step(
        "replace and remove",
        r#"
        setfattr -n user.mime_type -v application/json f
        [ "$(getfattr --only-values -n user.mime_type f)" = application/json ] || fail "replaced value"
        setfattr -x user.mime_type f
        if getfattr -n user.mime_type f 2>/dev/null; then fail "removed attribute still readable"; fi
        if getfattr -n user.absent f 2>err; then fail "absent attribute readable"; fi
        grep -q 'No such attribute' err || fail "absent attribute: $(cat err)"
        [ "$(cat f)" = data ] || fail "file content changed"
        mv f g
        [ "$(getfattr -e hex -n user.bin g | grep '^user.bin=')" = 'user.bin=0x00ff10' ] || fail "xattr lost by rename"
        "#,
    );
}

#[test]
fn fallocate_modes() {
    let rig = Rig::new(&[("fallocate", "util-linux"), ("stat", "coreutils"), ("cmp", "diffutils")]);
    rig.step(
        "fallocate -l (mode 0) sets the size, reads as zeros",
        r#"
        fallocate -l 1MiB f
        [ "$(stat -c %s f)" = 1048576 ] || fail "size after fallocate -l 1MiB: $(stat -c %s f)"
        head -c 1048576 /dev/zero | cmp - f || fail "allocated range is not zeros"
        "#,
    );
    rig.step(
        "fallocate --keep-size leaves the size",
        r#"
        fallocate --keep-size -o 1MiB -l 1MiB f
        [ "$(stat -c %s f)" = 1048576 ] || fail "size after --keep-size: $(stat -c %s f)"
        fallocate -o 1MiB -l 512KiB f
        [ "$(stat -c %s f)" = 1572864 ] || fail "size after growing with an offset: $(stat -c %s f)"
        "#,
    );
    rig.step(
        "fallocate --punch-hole zeroes the range and keeps the size",
        r#"
        head -c 200000 /dev/urandom > data
        cp data orig
        fallocate --punch-hole -o 4096 -l 70000 data
        [ "$(stat -c %s data)" = 200000 ] || fail "size after punch: $(stat -c %s data)"
        cmp -n 4096 data orig || fail "bytes before the hole changed"
        cmp -n 70000 -i 4096:0 data /dev/zero || fail "hole does not read as zeros"
        cmp -i 74096 data orig || fail "bytes after the hole changed"
        "#,
    );
}

#[test]
fn rename_over_and_unlink_of_open_files() {
    let rig = Rig::new(&[PYTHON]);
    rig.step(
        "rename over an open file: the open fd still reads the old content",
        r#"
        python3 - <<'EOF'
import os
with open("target", "wb") as f:
    f.write(b"old content" * 1000)
fd = os.open("target", os.O_RDONLY)
with open("target.tmp", "wb") as f:
    f.write(b"new")
os.rename("target.tmp", "target")
assert os.pread(fd, 11 * 1000, 0) == b"old content" * 1000, "open fd sees the new file"
assert os.fstat(fd).st_nlink == 0, f"replaced inode has nlink {os.fstat(fd).st_nlink}"
with open("target", "rb") as f:
    assert f.read() == b"new"
os.close(fd)
assert sorted(os.listdir(".")) == ["target"], os.listdir(".")
EOF
        "#,
    );
    rig.step(
        "unlink of an open file: readable and writable until close",
        r#"
        python3 - <<'EOF'
import os
fd = os.open("scratch", os.O_RDWR | os.O_CREAT, 0o600)
os.write(fd, b"before unlink;")
os.unlink("scratch")
assert not os.path.exists("scratch")
os.write(fd, b"after unlink")
os.fsync(fd)
assert os.pread(fd, 100, 0) == b"before unlink;after unlink"
st = os.fstat(fd)
assert st.st_nlink == 0 and st.st_size == 26, (st.st_nlink, st.st_size)
os.ftruncate(fd, 6)
assert os.pread(fd, 100, 0) == b"before"
os.close(fd)
assert "scratch" not in os.listdir(".")
EOF
        "#,
    );
}

#[test]
fn untar_diff_and_rm_rf_of_a_source_tree() {
    let rig = Rig::new(&[("tar", "tar"), ("diff", "diffutils"), ("find", "findutils")]);
    // The repository's own sources: a real tree of Rust, SQL, shell and TOML files.
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tarball = rig.native().join("tree.tar");
    let status = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&tarball)
        .arg("-C")
        .arg(&repo)
        .args(["src", "fs", "daemon", "vendor", "migrations", "tests", "scripts"])
        .status()
        .expect("run tar");
    assert!(status.success(), "tar -cf of the repository sources failed: {status}");
    std::os::unix::fs::chown(&tarball, Some(rig::UID), Some(rig::GID)).expect("chown tarball");
    rig.step(
        "untar on the mount and natively",
        r#"
        mkdir "$NATIVE/ref" tree
        tar -xf "$NATIVE/tree.tar" -C "$NATIVE/ref"
        tar -xf "$NATIVE/tree.tar" -C tree
        n=$(find tree | wc -l)
        [ "$n" -gt 200 ] || fail "only $n entries unpacked"
        "#,
    );
    rig.step(
        "diff -r and metadata comparison against the native copy",
        r#"
        diff -r --no-dereference "$NATIVE/ref" tree
        meta() { (cd "$1" && find . -mindepth 1 -printf '%P %y %m %T@ %l\n' | LC_ALL=C sort); }
        meta "$NATIVE/ref" > "$NATIVE/ref.meta"
        meta tree > "$NATIVE/mnt.meta"
        diff "$NATIVE/ref.meta" "$NATIVE/mnt.meta" || fail "names, types, modes, mtimes or link targets differ"
        "#,
    );
    rig.step(
        "rm -rf",
        r#"
        rm -rf tree
        [ ! -e tree ] || fail "tree still exists"
        [ -z "$(ls -A)" ] || fail "left behind: $(ls -A)"
        "#,
    );
}
