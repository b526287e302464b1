//! The bounds added after the review, each pushed one step past its configured value (see
//! `hostile_support`) by scope A: through signed tool calls (`grep_max_regex_bytes`,
//! `edit_max_diff_bytes`) and through A's FUSE mount (`max_links_per_file`, `max_xattrs_per_inode`,
//! `max_xattr_bytes_per_inode`, the byte quota charged by `fallocate` and by extended attributes,
//! the inode quota taken by `O_TMPFILE`). Each refusal has the documented status or errno, comes
//! before the work (no file read, no name or attribute created, the size and usage unchanged) and
//! is counted once under its bound in `scopefs_limit_refused_total` (all but the inode quota).
//! `open_log_max_bytes_per_scope` is pushed by a file held open and rewritten (not a refusal: the
//! changes are committed instead of logged), and checked by the log's size on the host's disk.
//! `tools_body_memory_bytes` is pushed by a flood of fat signed bodies and by answers nobody reads,
//! and checked by the daemon's resident growth (its peak reset by `clear_refs` first).
//!
//! Not here: `max_artifact_files`/`max_artifact_bytes`, `max_environment_paths` and
//! `max_shared_environments_per_user` are checked once a sandbox engine answers, and this daemon
//! has none (every compute route is 503 `compute_unavailable` first); the Docker-backed
//! tools_contract_compute and shared_compute exercise them.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::attacks::{client, tool, Ans, Verdict};
use super::{
    fresh_nonce, now_secs, signed_body_as, signed_body_with, Hostile, EDIT_DIFF, HMAC_SECRET, LINKS, MAX_UPLOAD,
    OPEN_LOG, SEND_TIMEOUT_SECS, TOOLS_BODY_MEMORY, XATTRS, XATTR_BYTES,
};

/// `Err(what())` unless `ok`.
fn want(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

/// Runs `checks`, then wants exactly `n` more refusals counted under `bound`.
fn counted(
    h: &Hostile,
    bound: &str,
    n: f64,
    checks: impl FnOnce() -> Result<String, String>,
) -> Result<String, String> {
    let before = h.refusals(bound);
    let done = checks()?;
    let added = h.refusals(bound) - before;
    want(added == n, || format!("{added} refusals counted under {bound}, want {n}"))?;
    Ok(done)
}

/// The answer of a tool call when it is `status` (and `code`, when not empty), else why not.
fn answered(what: &str, a: Result<Ans, String>, status: u16, code: &str) -> Result<Value, String> {
    let a = a?;
    let ok = a.status == status && (code.is_empty() || a.code == code);
    want(ok, || format!("{what}: {} {:?}, want {status} {code}: {}", a.status, a.code, a.body))?;
    Ok(a.body)
}

/// Polls `f` until it holds (the kernel sends RELEASE after close(2) returns), for at most 20 s.
fn wait_for(what: &str, mut f: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        if Instant::now() > deadline {
            return Err(format!("{what}: not after 20 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The errno of a failed call (0 when it succeeded).
fn errno<T>(r: std::io::Result<T>) -> i32 {
    r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
}

/// A libc return value: `Ok` when not negative, else the errno.
fn sys(rc: isize) -> std::io::Result<usize> {
    usize::try_from(rc).map_err(|_| std::io::Error::last_os_error())
}

fn cstr(s: impl AsRef<std::ffi::OsStr>) -> CString {
    CString::new(s.as_ref().as_encoded_bytes()).unwrap()
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) -> std::io::Result<usize> {
    let (p, name) = (cstr(p), cstr(name));
    // SAFETY: NUL-terminated strings and a value slice that outlive the call.
    sys(unsafe { libc::setxattr(p.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) } as isize)
}

/// The length of attribute `name` of `p` (`getxattr` with size 0).
fn xattr_len(p: &Path, name: &str) -> std::io::Result<usize> {
    let (p, name) = (cstr(p), cstr(name));
    // SAFETY: as `set_xattr`; a size of 0 writes nothing.
    sys(unsafe { libc::getxattr(p.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) })
}

/// The length of `p`'s attribute name list (`listxattr` with size 0).
fn xattr_names_len(p: &Path) -> std::io::Result<usize> {
    let p = cstr(p);
    // SAFETY: a NUL-terminated path; a size of 0 writes nothing.
    sys(unsafe { libc::listxattr(p.as_ptr(), std::ptr::null_mut(), 0) })
}

fn fallocate(f: &File, mode: i32, len: u64) -> std::io::Result<usize> {
    // SAFETY: a valid open descriptor.
    sys(unsafe { libc::fallocate(f.as_raw_fd(), mode, 0, len as i64) } as isize)
}

/// An unnamed file in `dir` (`open(O_TMPFILE)`).
fn tmpfile(dir: &Path) -> std::io::Result<File> {
    let dir = cstr(dir);
    // SAFETY: a NUL-terminated path; the descriptor returned is owned by the `File`.
    let fd = sys(unsafe { libc::open(dir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o600) } as isize)?;
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

/// Inodes the scope mounted at `mnt` may still create (its quota less its inodes and names).
fn free_inodes(mnt: &Path) -> u64 {
    let p = cstr(mnt);
    // SAFETY: an all-zero `statvfs` is valid; the call fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a writable `statvfs`.
    assert_eq!(unsafe { libc::statvfs(p.as_ptr(), &mut st) }, 0, "statvfs of the mount");
    st.f_ffree
}

/// `grep_max_regex_bytes`: a pattern compiling larger is 413 even over a missing directory (the
/// path is not looked at, no file is read); an invalid one is 400 `invalid_pattern` likewise.
pub fn grep_regex(h: &Hostile, thread: &str) -> Verdict {
    ("grep_max_regex_bytes", counted(h, "grep_regex", 2.0, || grep_regex_checks(h, thread)))
}

fn grep_regex_checks(h: &Hostile, thread: &str) -> Result<String, String> {
    let c = client();
    let grep = |pattern: &str, path: &str| tool(h, &c, thread, "grep_files", json!({"pattern": pattern, "path": path}));
    let hay = json!({"path": "hay/needle.txt", "content": "a needle here\n"});
    answered("write_file", tool(h, &c, thread, "write_file", hay), 200, "")?;
    let found = answered("grep need\\w+", grep(r"need\w+", "/workspace/hay"), 200, "")?;
    want(found["files_searched"] == 1 && found["matches"][0]["line"] == "a needle here", || format!("{found}"))?;
    answered("grep need\\w+ in a missing directory", grep(r"need\w+", "/workspace/missing"), 404, "")?;
    for path in ["/workspace/hay", "/workspace/missing"] {
        answered(&format!("grep \\w{{10}} in {path}"), grep(r"\w{10}", path), 413, "too_large")?;
    }
    answered("grep an invalid pattern", grep("need\\w+(", "/workspace/missing"), 400, "invalid_pattern")?;
    Ok("\\w{10} is 413 and `need\\w+(` 400 before the path is looked at; `need\\w+` searches".into())
}

/// `edit_max_diff_bytes`: an edit whose diff is longer is made whole and answers a diff cut at the
/// bound with `diff_truncated` (not an error); a small one answers its whole diff.
pub fn edit_diff(h: &Hostile, thread: &str) -> Verdict {
    ("edit_max_diff_bytes", counted(h, "edit_diff", 1.0, || edit_diff_checks(h, thread)))
}

fn edit_diff_checks(h: &Hostile, thread: &str) -> Result<String, String> {
    let c = client();
    let text: String = (1..=2000).map(|i| format!("line {i}\n")).collect();
    let edit = |old: &str, new: &str, all: bool| {
        let params = json!({"path": "lines.txt", "old_string": old, "new_string": new, "replace_all": all});
        tool(h, &c, thread, "edit_file", params)
    };
    answered("write_file", tool(h, &c, thread, "write_file", json!({"path": "lines.txt", "content": text})), 200, "")?;
    let small = answered("edit one line", edit("line 7\n", "seven\n", false), 200, "")?;
    let diff = small["diff"].as_str().unwrap_or_default();
    want(small["diff_truncated"] == false && diff.contains("-line 7\n+seven\n"), || format!("{small}"))?;
    let all = answered("edit every line", edit("line", "LINE", true), 200, "")?;
    let diff_len = all["diff"].as_str().map_or(0, str::len) as u64;
    let cut = all["diff_truncated"] == true && diff_len == EDIT_DIFF && all["replacements"] == 1999;
    want(cut, || {
        format!("diff of {diff_len} bytes, diff_truncated {}: {}", all["diff_truncated"], all["replacements"])
    })?;
    let back = answered("read_file", tool(h, &c, thread, "read_file", json!({"path": "lines.txt"})), 200, "")?;
    let edited = text.replace("line 7\n", "seven\n").replace("line", "LINE");
    want(back["content"] == edited.as_str(), || "the edit with a cut diff was not made whole".into())?;
    Ok(format!("{} replacements made, diff cut at {diff_len} bytes", all["replacements"]))
}

/// The byte quota: `fallocate` one byte past it (mode 0 and `KEEP_SIZE`) is `EDQUOT` with the size
/// and usage unchanged; extended attributes are charged to it up to the last byte, not one more.
pub fn quota_bytes(h: &Hostile, thread: &str, mnt: &Path) -> Verdict {
    ("fallocate and xattrs against quota_bytes", counted(h, "quota_bytes", 3.0, || quota_checks(h, thread, mnt)))
}

fn quota_checks(h: &Hostile, thread: &str, mnt: &Path) -> Result<String, String> {
    let usage = h.usage(thread);
    let (quota, used) = (usage["quota"]["bytes"].as_u64().unwrap_or(0), usage["bytes"].as_u64().unwrap_or(0));
    let room = quota - used;
    let p = mnt.join("alloc.bin");
    let f = OpenOptions::new().read(true).write(true).create_new(true).open(&p).map_err(|e| e.to_string())?;
    want(errno(fallocate(&f, 0, room + 1)) == libc::EDQUOT, || "fallocate past the quota".into())?;
    let keep = fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, room + 1);
    want(errno(keep) == libc::EDQUOT, || "fallocate KEEP_SIZE past the quota".into())?;
    let size = f.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
    want(size == 0 && h.usage(thread)["bytes"] == used, || format!("refused fallocate left size {size}"))?;
    fallocate(&f, 0, room - 100).map_err(|e| format!("fallocate up to 100 bytes below the quota: {e}"))?;
    drop(f);
    set_xattr(&p, "user.q", &[b'q'; 94]).map_err(|e| format!("an attribute of the last 100 bytes: {e}"))?;
    want(errno(set_xattr(&p, "user.r", b"")) == libc::EDQUOT, || "an attribute past the quota".into())?;
    want(errno(xattr_len(&p, "user.r")) == libc::ENODATA, || "the refused attribute exists".into())?;
    wait_for("usage at the quota", || h.usage(thread)["bytes"] == quota)?;
    fs::remove_file(&p).map_err(|e| e.to_string())?;
    wait_for("usage back after the unlink", || h.usage(thread)["bytes"] == used)?;
    Ok(format!("{room} bytes of room: one more refused by fallocate; attributes fill it to the byte"))
}

/// `max_links_per_file`: one more name is `EMLINK`; no name is created, no inode taken.
pub fn hard_links(h: &Hostile, mnt: &Path) -> Verdict {
    ("max_links_per_file", counted(h, "hard_links", 1.0, || links_checks(mnt)))
}

fn links_checks(mnt: &Path) -> Result<String, String> {
    let dir = mnt.join("links");
    fs::create_dir(&dir).map_err(|e| e.to_string())?;
    let first = dir.join("n0");
    fs::write(&first, b"linked").map_err(|e| e.to_string())?;
    for i in 1..LINKS {
        fs::hard_link(&first, dir.join(format!("n{i}"))).map_err(|e| format!("link {i}: {e}"))?;
    }
    let nlink = || fs::metadata(&first).map(|m| m.nlink()).unwrap_or(0);
    let free = free_inodes(mnt);
    want(errno(fs::hard_link(&first, dir.join("over"))) == libc::EMLINK, || "one link too many".into())?;
    let absent = errno(fs::symlink_metadata(dir.join("over"))) == libc::ENOENT;
    want(absent && nlink() == LINKS && free_inodes(mnt) == free, || format!("after EMLINK: nlink {}", nlink()))?;
    fs::remove_file(dir.join("n1")).map_err(|e| e.to_string())?;
    fs::hard_link(&first, dir.join("over")).map_err(|e| format!("a link in a freed place: {e}"))?;
    Ok(format!("{LINKS} names, one more EMLINK, a freed name given again"))
}

/// `max_xattrs_per_inode` and `max_xattr_bytes_per_inode`: one attribute more, or more bytes, is
/// `ENOSPC` and the refused attribute does not exist (or keeps its value).
pub fn xattrs(h: &Hostile, mnt: &Path) -> Verdict {
    ("max_xattrs_per_inode, max_xattr_bytes_per_inode", counted(h, "inode_xattrs", 3.0, || xattr_checks(mnt)))
}

fn xattr_checks(mnt: &Path) -> Result<String, String> {
    let f = mnt.join("attrs.txt");
    fs::write(&f, b"attributes").map_err(|e| e.to_string())?;
    for i in 0..XATTRS {
        set_xattr(&f, &format!("user.a{i}"), b"v").map_err(|e| format!("attribute {i}: {e}"))?;
    }
    let names = xattr_names_len(&f).unwrap_or(0);
    want(errno(set_xattr(&f, "user.over", b"v")) == libc::ENOSPC, || "one attribute too many".into())?;
    want(errno(xattr_len(&f, "user.over")) == libc::ENODATA, || "the refused attribute exists".into())?;
    want(xattr_names_len(&f).unwrap_or(0) == names, || "the attribute list changed".into())?;
    set_xattr(&f, "user.a0", b"w").map_err(|e| format!("replacing one at the bound: {e}"))?;

    let g = mnt.join("attr-bytes.txt");
    fs::write(&g, b"attribute bytes").map_err(|e| e.to_string())?;
    // "user.big" is 8 bytes: 8 + 1000 of the 1024 allowed.
    let big = (XATTR_BYTES - 24) as usize;
    set_xattr(&g, "user.big", &vec![b'x'; big]).map_err(|e| format!("a {big}-byte attribute: {e}"))?;
    want(errno(set_xattr(&g, "user.more", &[b'y'; 20])) == libc::ENOSPC, || "bytes past the bound".into())?;
    want(errno(xattr_len(&g, "user.more")) == libc::ENODATA, || "the refused attribute exists".into())?;
    let grown = vec![b'x'; XATTR_BYTES as usize - 7];
    want(errno(set_xattr(&g, "user.big", &grown)) == libc::ENOSPC, || "growing past the bound".into())?;
    want(xattr_len(&g, "user.big").ok() == Some(big), || "the refused growth changed the value".into())?;
    Ok(format!("{XATTRS} attributes then ENOSPC; {XATTR_BYTES} bytes then ENOSPC"))
}

/// The inode quota: an `O_TMPFILE` file takes an inode while it is open: with the quota full it is
/// `EDQUOT` (nothing created), and while one is open no other file may be created. (Only the
/// errno: the engine counts `quota_inodes` refusals of `link` but not of `create`/`O_TMPFILE`.)
pub fn tmpfile_inodes(mnt: &Path) -> Verdict {
    ("O_TMPFILE against quota_inodes", tmpfile_checks(mnt))
}

fn tmpfile_checks(mnt: &Path) -> Result<String, String> {
    let dir = mnt.join("inodes");
    fs::create_dir(&dir).map_err(|e| e.to_string())?;
    let free = free_inodes(mnt);
    for i in 0..free {
        File::create(dir.join(format!("f{i}"))).map_err(|e| format!("file {i} of {free}: {e}"))?;
    }
    let listed = || fs::read_dir(&dir).map(|d| d.count() as u64).unwrap_or(u64::MAX);
    want(free_inodes(mnt) == 0, || format!("{} inodes free after filling", free_inodes(mnt)))?;
    want(errno(File::create(dir.join("over"))) == libc::EDQUOT, || "a file past the inode quota".into())?;
    want(errno(tmpfile(&dir)) == libc::EDQUOT, || "O_TMPFILE past the inode quota".into())?;
    want(listed() == free, || format!("{} entries after the refusals, want {free}", listed()))?;
    fs::remove_file(dir.join("f0")).map_err(|e| e.to_string())?;
    wait_for("the freed inode", || free_inodes(mnt) == 1)?;
    let tmp = tmpfile(&dir).map_err(|e| format!("O_TMPFILE with one inode free: {e}"))?;
    want(errno(File::create(dir.join("f0"))) == libc::EDQUOT, || "a file while O_TMPFILE holds the last".into())?;
    drop(tmp);
    wait_for("the unnamed file's inode back", || free_inodes(mnt) == 1)?;
    File::create(dir.join("f0")).map_err(|e| format!("a file once the unnamed one is gone: {e}"))?;
    Ok(format!("{free} inodes filled; O_TMPFILE refused, then holding the last one while open"))
}

/// `tools_body_memory_bytes`: 48 signed `write_file` bodies of 9 MiB (content just over the file
/// limit, so each is verified and then refused 413 by its worker, writing nothing) sent at once by
/// one user over four conversations. Each is held from its first byte until answered, so without
/// the budget a few dozen sit in memory at once (verified, waiting for the user's share of
/// workers); with it the daemon's resident set grows by at most the budget and its parsed copy.
/// Every answer is the 413, or 503 `busy` for a body that found no room in time.
pub fn tools_body_memory(h: &Hostile) -> Verdict {
    let what = "tools_body_memory_bytes";
    let threads: Vec<String> = (0..4).map(|i| format!("thr-bodies-{i}")).collect();
    for t in &threads {
        h.provision(t);
    }
    let content = "a".repeat((MAX_UPLOAD.min(10 << 20) + (1 << 20)) as usize);
    let rss_before = h.reset_peak_rss();
    let answers: Vec<Result<Ans, String>> = std::thread::scope(|s| {
        let jobs: Vec<_> = (0..48)
            .map(|i| {
                let (thread, content) = (&threads[i % threads.len()], &content);
                s.spawn(move || {
                    tool(h, &client(), thread, "write_file", json!({"path": "big.txt", "content": content}))
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let grown = h.peak_rss().saturating_sub(rss_before);
    let mut counts = std::collections::BTreeMap::new();
    for a in answers {
        let a = match a {
            Ok(a) => a,
            Err(why) => return (what, Err(format!("a fat body: {why}"))),
        };
        if !matches!((a.status, a.code.as_str()), (413, "too_large") | (503, "busy")) {
            return (what, Err(format!("a fat body answered {} {:?}: {}", a.status, a.code, a.body)));
        }
        *counts.entry(a.status).or_insert(0) += 1;
    }
    let allowed = 3 * TOOLS_BODY_MEMORY + (96 << 20);
    let verdict = want(grown <= allowed, || {
        format!("resident memory grew {} MiB under the flood (allowed {} MiB)", grown >> 20, allowed >> 20)
    })
    .map(|()| format!("answers by status {counts:?}; resident memory grew {} MiB", grown >> 20));
    (what, verdict)
}

/// `tools_body_memory_bytes` holds answers too, until they are sent: eight connections ask for a
/// `read_file` whose answer is 36 MiB (6 MiB of control characters, six bytes each as JSON) and
/// never read it. Without the charge every answer stayed in memory until its connection went; with
/// it one is built, and the others wait for room and are refused (503 `busy`). Then, with those
/// connections still open, the send timeout closes each one whose answer was built, and a fresh
/// `read_file` of the same answer is served (without it, unread answers kept the budget forever).
pub fn tools_answer_memory(h: &Hostile) -> Verdict {
    let what = "tools_body_memory_bytes (answers nobody reads)";
    let thread = "thr-answers";
    let scope = h.provision(thread);
    if let Err(e) = fs::write(h.mountpoint(&scope).join("ctl.txt"), vec![1u8; 6 << 20]) {
        return (what, Err(format!("writing the file: {e}")));
    }
    let before = body_refusals(h);
    let rss_before = h.reset_peak_rss();
    let path = "/tools/read_file";
    let held = match unread_reads(h, thread, "ctl.txt", 8) {
        Ok(held) => held,
        Err(e) => return (what, Err(e)),
    };
    let timeouts_before = h.refusals("send_timeout");
    let refused = wait_for("six requests refused for want of room", || body_refusals(h) - before >= 6.0);
    let grown = h.peak_rss().saturating_sub(rss_before);
    // Every request is refused or its answer was built; each built one's client takes nothing.
    let closed = wait_for("every unread answer's connection closed by the send timeout", || {
        (body_refusals(h) - before) + (h.refusals("send_timeout") - timeouts_before) >= 8.0
    });
    let fresh = closed.and_then(|()| {
        let body = signed_body_with(HMAC_SECRET, path, thread, &json!({"path": "ctl.txt"}), now_secs(), &fresh_nonce());
        let r = client().post(h.url(path)).header("content-type", "application/json").body(body).send();
        match r.map(|r| r.status()) {
            Ok(s) if s.is_success() => Ok(()),
            other => Err(format!("a fresh read_file with the unread connections still open: {other:?}")),
        }
    });
    drop(held);
    let allowed = 2 * TOOLS_BODY_MEMORY + (64 << 20);
    let verdict = want(grown <= allowed, || {
        format!("resident memory grew {} MiB with the answers unread (allowed {} MiB)", grown >> 20, allowed >> 20)
    })
    .and(refused)
    .and(fresh);
    (
        what,
        verdict.map(|()| {
            format!(
                "answers unread: resident memory grew {} MiB; their connections closed after {SEND_TIMEOUT_SECS} s",
                grown >> 20
            )
        }),
    )
}

/// Requests refused for want of room in `tools_body_memory_bytes`, for the whole budget or for
/// their user's share.
fn body_refusals(h: &Hostile) -> f64 {
    h.refusals("tools_body_memory") + h.refusals("tools_body_memory_per_user")
}

/// Raw `read_file` requests of `path` in `thread`'s scope whose answers are never read.
fn unread_reads(h: &Hostile, thread: &str, path: &str, n: usize) -> Result<Vec<std::net::TcpStream>, String> {
    use std::io::Write;
    let route = "/tools/read_file";
    (0..n)
        .map(|_| {
            let body = signed_body_with(HMAC_SECRET, route, thread, &json!({"path": path}), now_secs(), &fresh_nonce());
            let head = format!(
                "POST {route} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let mut s = std::net::TcpStream::connect(h.addr).map_err(|e| format!("connecting: {e}"))?;
            s.write_all(head.as_bytes())
                .and_then(|()| s.write_all(body.as_bytes()))
                .map_err(|e| format!("sending: {e}"))?;
            Ok(s)
        })
        .collect()
}

/// `tools_body_memory_per_user_bytes`: one user asks for eight `read_file` answers of 21 MiB (3 MiB
/// of control characters; more than the sockets' buffers take) and reads none. Two of them take its
/// share, the rest are refused 429 `user_busy`, and another user's answer of the same size is
/// served beside them. Without the share three are built, the budget is full, and the other user
/// waits and gets 503.
pub fn tools_answer_share(h: &Hostile) -> Verdict {
    let what = "tools_body_memory_per_user_bytes (one user's unread answers)";
    let (hog, other) = ("thr-share-hog", "thr-share-other");
    for thread in [hog, other] {
        let scope = h.provision(thread);
        if let Err(e) = fs::write(h.mountpoint(&scope).join("ctl.txt"), vec![1u8; 3 << 20]) {
            return (what, Err(format!("writing the file: {e}")));
        }
    }
    let before = h.refusals("tools_body_memory_per_user");
    let held = match unread_reads(h, hog, "ctl.txt", 8) {
        Ok(held) => held,
        Err(e) => return (what, Err(e)),
    };
    let refused = wait_for("six of one user's requests refused past its share", || {
        h.refusals("tools_body_memory_per_user") - before >= 6.0
    });
    let route = "/tools/read_file";
    let body =
        signed_body_as(HMAC_SECRET, route, "user-3", other, &json!({"path": "ctl.txt"}), now_secs(), &fresh_nonce());
    let start = Instant::now();
    let r = client().post(h.url(route)).header("content-type", "application/json").body(body).send();
    let served = match r.map(|r| (r.status(), r.json::<Value>())) {
        Ok((s, Ok(v))) if s.is_success() && v["size_bytes"] == json!(3 << 20) => Ok(()),
        Ok((s, v)) => {
            Err(format!("another user's read_file beside them: {s} {:?}", v.ok().map(|v| v["error"].clone())))
        }
        Err(e) => Err(format!("another user's read_file beside them: {e}")),
    };
    let took = start.elapsed();
    drop(held);
    (
        what,
        refused.and(served).map(|()| format!("two answers held, six refused 429; another user's served in {took:.1?}")),
    )
}

/// `open_log_max_bytes_per_scope`: a scope holds a file open and rewrites its first 16 KiB (a block
/// kept in memory, so each change is logged whole) in 8 KiB writes: 64 MiB of changes, sixteen
/// times the bound. Every write is accepted, the scope's open-file log on the host's disk never
/// passes the bound by more than a write, and the file reads back its last bytes.
pub fn open_log(h: &Hostile, scope: &str, mnt: &Path) -> Verdict {
    use std::os::unix::fs::FileExt;
    let name = "open_log_max_bytes_per_scope";
    let log = h.dir.path().join("data/staging").join(scope).join("open-log");
    let check = || -> Result<String, String> {
        let path = mnt.join("rewritten-while-open");
        let file = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path);
        let file = file.map_err(|e| format!("creating: {e}"))?;
        let (write, writes) = (8 * 1024usize, 8 * 1024u64);
        let mut largest = 0;
        for i in 0..writes {
            let data = vec![(i % 251) as u8; write];
            file.write_all_at(&data, (i % 2) * write as u64).map_err(|e| format!("write {i}: {e}"))?;
            largest = largest.max(fs::metadata(&log).map_or(0, |m| m.len()));
        }
        want(largest <= OPEN_LOG + (1 << 20), || {
            format!("the open-file log reached {largest} bytes (bound {OPEN_LOG})")
        })?;
        let mut back = vec![0u8; 2 * write];
        file.read_exact_at(&mut back, 0).map_err(|e| format!("reading back: {e}"))?;
        let last = |i: u64| vec![(i % 251) as u8; write];
        want(back[..write] == last(writes - 2)[..] && back[write..] == last(writes - 1)[..], || {
            "the file does not read back its last writes".into()
        })?;
        drop(file);
        fs::remove_file(&path).map_err(|e| format!("removing: {e}"))?;
        Ok(format!(
            "{} MiB of changes to a file held open; the log peaked at {largest} bytes",
            (writes * write as u64) >> 20
        ))
    };
    (name, check())
}
