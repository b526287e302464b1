//! The security reviews' attacks that HTTP and a FUSE mount can reproduce (H1, H2, H3, M1, M2, M3;
//! N2, N3, N6), each run against scope A and judged by the FIXED behaviour: a clean 4xx refusal (or success
//! within the bounds), never a 5xx, never a hang; and the bystander loop of scope B.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use serde_json::{json, Value};

use super::{
    fresh_nonce, now_secs, signed_body_as, signed_body_with, Hostile, Latencies, BLOCK, DIR_HANDLES, HMAC_SECRET,
    MAX_UPLOAD, PEAK_RSS, SERVICE_TOKEN, STAGING_PER_SCOPE,
};

/// The longest one attack request may take before it counts as a hang.
pub const ATTACK_LIMIT: Duration = Duration::from_secs(30);
/// Deepest chain scope A may build through its mount: the default `[limits] max_path_depth` is
/// 512; anything up to twice that counts as "bounded".
pub const DEPTH_BOUND: usize = 1024;
/// How deep the chain attack tries to go.
const CHAIN_TRY: usize = 2000;

/// The result of one attack: `Ok(what happened)` or `Err(why it is wrong)`.
pub type Verdict = (&'static str, Result<String, String>);

/// An answer: status, error code, JSON body (`null` when not JSON), time taken.
pub struct Ans {
    pub status: u16,
    pub code: String,
    pub body: Value,
    pub took: Duration,
}

pub fn client() -> Client {
    Client::builder().timeout(ATTACK_LIMIT).build().unwrap()
}

fn answer(r: reqwest::Result<reqwest::blocking::Response>, start: Instant) -> Result<Ans, String> {
    let r = r.map_err(|e| format!("no answer after {:?}: {e}", start.elapsed()))?;
    let status = r.status().as_u16();
    let body: Value = r.json().unwrap_or(Value::Null);
    let code = body["error"]["code"].as_str().unwrap_or_default().to_string();
    Ok(Ans { status, code, body, took: start.elapsed() })
}

/// Calls `/tools/<name>` as `thread`, signed now.
pub fn tool(h: &Hostile, c: &Client, thread: &str, name: &str, params: Value) -> Result<Ans, String> {
    let path = format!("/tools/{name}");
    let body = signed_body_with(HMAC_SECRET, &path, thread, &params, now_secs(), &fresh_nonce());
    let start = Instant::now();
    answer(c.post(h.url(&path)).header("content-type", "application/json").body(body).send(), start)
}

fn service(req: reqwest::blocking::RequestBuilder) -> Result<Ans, String> {
    let start = Instant::now();
    answer(req.bearer_auth(SERVICE_TOKEN).send(), start)
}

/// A clean refusal: 4xx within [`ATTACK_LIMIT`].
fn refused(what: &str, a: Result<Ans, String>) -> Result<String, String> {
    let a = a?;
    if (400..500).contains(&a.status) && a.took < ATTACK_LIMIT {
        Ok(format!("{what}: {} {} in {:?}", a.status, a.code, a.took))
    } else {
        Err(format!("{what}: expected a 4xx refusal, got {} {:?} in {:?}", a.status, a.code, a.took))
    }
}

/// Answered (2xx or 4xx, never 5xx) within [`ATTACK_LIMIT`].
fn bounded(what: &str, a: Result<Ans, String>) -> Result<String, String> {
    let a = a?;
    if a.status < 500 && a.took < ATTACK_LIMIT {
        Ok(format!("{what}: {} {} in {:?}", a.status, a.code, a.took))
    } else {
        Err(format!("{what}: expected an answer below 500, got {} {:?} in {:?}", a.status, a.code, a.took))
    }
}

pub fn all_ok(parts: Vec<Result<String, String>>) -> Result<String, String> {
    let (ok, bad): (Vec<_>, Vec<_>) = parts.into_iter().partition(|p| p.is_ok());
    let ok: Vec<String> = ok.into_iter().map(|p| p.unwrap()).collect();
    if bad.is_empty() {
        Ok(ok.join("; "))
    } else {
        Err(bad.into_iter().map(|p| p.unwrap_err()).collect::<Vec<_>>().join("; "))
    }
}

/// M1: 14 MB `[0,0,…]` bodies (over the limit) and ones just under it, unauthenticated, all at once.
pub fn m1_unauthenticated_giant_bodies(h: &Hostile) -> Verdict {
    let limit = (MAX_UPLOAD.min(10 << 20) / 3 * 4 + (1 << 20)) as usize;
    let zeros = |n: usize| {
        let mut s = String::with_capacity(n + 2);
        s.push('[');
        while s.len() < n {
            s.push_str("0,");
        }
        s.push_str("0]");
        s
    };
    let (over, under) = (zeros(14 << 20), zeros(limit - 64 * 1024));
    let mut results: Vec<Result<String, String>> = std::thread::scope(|s| {
        let jobs: Vec<_> = (0..12)
            .map(|i| {
                let body = if i < 4 { over.clone() } else { under.clone() };
                s.spawn(move || {
                    let start = Instant::now();
                    let r = client()
                        .post(h.url("/tools/read_file"))
                        .header("content-type", "application/json")
                        .body(body)
                        .send();
                    refused(if i < 4 { "14 MB body" } else { "body just under the limit" }, answer(r, start))
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    // Parsing them whole before authentication costs ~30x their size each (the M1 finding).
    let peak = h.peak_rss();
    results.push(if peak <= PEAK_RSS {
        Ok(format!("peak RSS {} MiB", peak >> 20))
    } else {
        Err(format!("the daemon's peak RSS reached {} MiB (bound {} MiB)", peak >> 20, PEAK_RSS >> 20))
    });
    ("M1 unauthenticated [0,0,...] bodies", all_ok(results))
}

/// H1: 8 MiB PUTs of zeros (128 identical blocks each) must not leak the global staging budget:
/// every PUT succeeds, and once the file is deleted staging drains back to (almost) zero.
pub fn h1_identical_sparse_blocks(h: &Hostile, thread: &str) -> Verdict {
    let c = client();
    let zeros = vec![0u8; MAX_UPLOAD as usize];
    let mut parts = Vec::new();
    for i in 0..12 {
        let a = service(
            c.put(h.url("/api/workspace/file"))
                .query(&[("threadId", thread), ("path", "zeros.bin")])
                .body(zeros.clone()),
        );
        match a {
            Ok(a) if (200..300).contains(&a.status) => {}
            Ok(a) => parts
                .push(Err(format!("PUT #{i} of 8 MiB zeros: {} {:?} (507 no_space is the H1 leak)", a.status, a.code))),
            Err(e) => parts.push(Err(format!("PUT #{i}: {e}"))),
        }
    }
    parts.push(bounded(
        "DELETE zeros.bin",
        service(c.delete(h.url("/api/workspace/file")).query(&[("threadId", thread), ("path", "zeros.bin")])),
    ));
    // The uploads of a local store finish quickly; staging must come back down.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut staged = h.metric("scopefs_staging_bytes");
    while staged.is_none_or(|b| b > 4.0 * 1024.0 * 1024.0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        staged = h.metric("scopefs_staging_bytes");
    }
    match staged {
        Some(b) if b <= 4.0 * 1024.0 * 1024.0 => parts.push(Ok(format!("staging back to {b} bytes"))),
        other => parts.push(Err(format!("staging still {other:?} bytes 20 s after the PUTs: leaked"))),
    }
    ("H1 identical sparse blocks via PUT", all_ok(parts))
}

/// H2 and M3 (patterns): `edit_file` `replace_all` whose result would be ~100 GB, a 60 KB grep
/// pattern and a 5 000-character glob over a 1 MB file: refused before the work.
pub fn h2_m3_patterns(h: &Hostile, thread: &str) -> Verdict {
    let c = client();
    let mut parts = vec![bounded(
        "write_file 1 MB of 'a'",
        tool(h, &c, thread, "write_file", json!({"path": "aaa.txt", "content": "a".repeat(1_000_000)})),
    )];
    parts.push(refused(
        "edit_file replace_all 'a' -> 100 KB (1e11-byte result)",
        tool(
            h,
            &c,
            thread,
            "edit_file",
            json!({"path": "aaa.txt", "old_string": "a", "new_string": "b".repeat(100_000), "replace_all": true}),
        ),
    ));
    parts.push(refused(
        "grep_files with a 60 KB pattern",
        tool(h, &c, thread, "grep_files", json!({"pattern": format!("{}b", "a".repeat(60_000))})),
    ));
    parts.push(refused(
        "glob_files with a 5000-byte pattern",
        tool(h, &c, thread, "glob_files", json!({"pattern": "*".repeat(5000)})),
    ));
    ("H2 edit blow-up, M3 long patterns", all_ok(parts))
}

/// H3: many `opendir` handles on a big directory of scope A's mount: beyond
/// `max_dir_handles_per_mount` they are refused; closing them frees the slots.
pub fn h3_many_dir_handles(mnt: &Path) -> Verdict {
    let big = mnt.join("big");
    if let Err(e) = std::fs::create_dir_all(&big) {
        return ("H3 dir handles", Err(format!("mkdir big: {e}")));
    }
    for i in 0..400 {
        if let Err(e) = std::fs::File::create(big.join(format!("{i:0200}"))) {
            return ("H3 dir handles", Err(format!("creating entry {i}: {e}")));
        }
    }
    let mut held = Vec::new();
    let mut refusals = Vec::new();
    for _ in 0..DIR_HANDLES * 3 {
        match std::fs::read_dir(&big) {
            Ok(mut it) => match it.next() {
                Some(Ok(_)) => held.push(it),
                Some(Err(e)) => refusals.push(e.raw_os_error()),
                None => refusals.push(None),
            },
            Err(e) => refusals.push(e.raw_os_error()),
        }
    }
    let opened = held.len();
    drop(held);
    let relisted = std::fs::read_dir(&big).map(|it| it.count()).unwrap_or(0);
    let verdict = if opened as u64 > DIR_HANDLES + 8 || refusals.is_empty() {
        Err(format!("{opened} handles with a snapshot held at once (bound {DIR_HANDLES}), {} refused", refusals.len()))
    } else if relisted != 400 {
        Err(format!("after closing the handles a listing shows {relisted} entries, not 400"))
    } else {
        Ok(format!("{opened} held, {} refused (errno {:?}), slots freed on close", refusals.len(), refusals[0]))
    };
    ("H3 many opendir handles via the mount", verdict)
}

/// N6: four files of scope A held open through its mount, one byte written at the end of each of
/// 400 blocks of each: 1,600 sparse blocks, 100 MiB of length, more than the daemon's dirty memory
/// (64 MiB, where blocks of up to 64 KiB start) and A's staging share (`STAGING_PER_SCOPE`,
/// 24 MiB) together. A working file is charged the pages written into it while its file is open,
/// so every byte is accepted (before, a block was charged its length and A's writes past its share
/// answered `ENOSPC`). Closing charges each block its length: a close answers success or `ENOSPC`
/// (told, never lost silently); every file is then removed.
pub fn n6_sparse_files_held_open(mnt: &Path) -> Verdict {
    use std::os::unix::fs::FileExt;
    let name = "N6 sparse files held open";
    let blocks = 400u64;
    let mut held = Vec::new();
    for f in 0..4 {
        let path = mnt.join(format!("sparse-{f}"));
        match std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path) {
            Ok(file) => held.push((path, file)),
            Err(e) => return (name, Err(format!("creating {f}: {e}"))),
        }
    }
    for i in 1..=blocks {
        for (f, (_, file)) in held.iter().enumerate() {
            if let Err(e) = file.write_all_at(b"x", i * BLOCK - 1) {
                let total = (i - 1) * held.len() as u64 + f as u64;
                let length = (total * BLOCK) >> 20;
                let share = STAGING_PER_SCOPE >> 20;
                return (
                    name,
                    Err(format!("byte {total} refused ({e}) after {length} MiB of sparse length (share {share} MiB)")),
                );
            }
        }
    }
    let mut closes = std::collections::BTreeMap::new();
    for (path, file) in held {
        // `File::drop` ignores close's answer: flush explicitly through a duplicate of its descriptor.
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        // SAFETY: `dup` of a descriptor this function owns; the duplicate is closed right away.
        let rc = unsafe { libc::close(libc::dup(fd)) };
        let errno = if rc == 0 { 0 } else { std::io::Error::last_os_error().raw_os_error().unwrap_or(-1) };
        *closes.entry(errno).or_insert(0) += 1;
        drop(file);
        if let Err(e) = std::fs::remove_file(&path) {
            return (name, Err(format!("removing {}: {e}", path.display())));
        }
    }
    let verdict = if closes.keys().all(|errno| *errno == 0 || *errno == libc::ENOSPC) {
        Ok(format!("{} bytes in sparse blocks accepted while open; closes by errno {closes:?}", blocks * 4))
    } else {
        Err(format!("closes answered errno {closes:?} (want 0 or ENOSPC)"))
    };
    (name, verdict)
}

/// M2 and M3 (globs): a chain as deep as the mount allows, a deeper one through `write_file`,
/// `**` globs over the chain, then the recursive list and recursive delete of it.
pub fn m2_m3_deep_chain(h: &Hostile, thread: &str, mnt: &Path) -> Verdict {
    let mut parts = Vec::new();
    let depth = mkdir_chain(mnt, CHAIN_TRY);
    parts.push(match depth {
        Ok(d) if d <= DEPTH_BOUND => Ok(format!("mount chain stopped at depth {d}")),
        Ok(d) => Err(format!("the mount let the chain reach depth {d} (bound {DEPTH_BOUND})")),
        Err(e) => Err(e),
    });
    let c = client();
    parts.push(refused(
        "write_file 2000 levels deep",
        tool(h, &c, thread, "write_file", json!({"path": format!("{}f", "e/".repeat(CHAIN_TRY)), "content": "x"})),
    ));
    let globs: Vec<Result<String, String>> = std::thread::scope(|s| {
        let jobs: Vec<_> = ["**/**/**/**", "**/**/**/**/*", &format!("{}x", "**/".repeat(40)), "d/**/**/**/**/z"]
            .into_iter()
            .map(|p| {
                let p = p.to_string();
                s.spawn(move || {
                    bounded(&format!("glob {p:.20}"), tool(h, &client(), thread, "glob_files", json!({"pattern": p})))
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    parts.extend(globs);
    parts.push(bounded(
        "recursive list",
        service(c.get(h.url("/api/workspace")).query(&[("threadId", thread), ("path", ""), ("recursive", "1")])),
    ));
    let del = service(c.delete(h.url("/api/workspace/file")).query(&[
        ("threadId", thread),
        ("path", "d"),
        ("recursive", "1"),
    ]));
    parts.push(match del {
        Ok(a) if (200..300).contains(&a.status) && a.took < ATTACK_LIMIT => {
            Ok(format!("recursive delete {} in {:?}", a.status, a.took))
        }
        Ok(a) => Err(format!("recursive delete of the chain: {} {:?} in {:?}", a.status, a.code, a.took)),
        Err(e) => Err(format!("recursive delete of the chain: {e}")),
    });
    ("M2 deep chain, M3 ** globs", all_ok(parts))
}

/// Creates `d/d/d/…` below `root` one level at a time through directory descriptors; returns the
/// depth reached when the mount refused (or `max`).
fn mkdir_chain(root: &Path, max: usize) -> Result<usize, String> {
    let name = CString::new("d").unwrap();
    let croot = CString::new(root.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: plain open(2)/mkdirat(2)/openat(2)/close(2) on descriptors this function owns.
    unsafe {
        let mut fd = libc::open(croot.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(format!("open mount root: {}", std::io::Error::last_os_error()));
        }
        let mut depth = 0;
        while depth < max {
            if libc::mkdirat(fd, name.as_ptr(), 0o755) != 0 {
                break;
            }
            let next = libc::openat(fd, name.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC);
            libc::close(fd);
            if next < 0 {
                return Ok(depth + 1);
            }
            fd = next;
            depth += 1;
        }
        libc::close(fd);
        Ok(depth)
    }
}

/// Files under the listing bomb's 16,063-byte prefix: the review's 199,000 scaled down, yet any
/// listing of them that built every path would take 20,000 x 16 KB = 320 MB.
const BOMB_FILES: usize = 20_000;

/// N2 and issue 22 acceptance c: 64 directories of 250-byte names, then `BOMB_FILES` files in the
/// deepest; sixteen `list_dir` of it, four recursive WebUI listings and two zip downloads at once.
/// Each is refused before it builds its paths (422 `listing_too_large`, or 429 `scope_busy` while
/// the scope's other listings hold its share of listing memory); the daemon's peak RSS is checked
/// with the other attacks' (`PEAK_RSS`).
pub fn n2_listing_bomb(h: &Hostile, thread: &str, mnt: &Path) -> Verdict {
    const NAME: &str = "N2 listing bomb: 20,000 files under a 16 KB prefix";
    let prefix = match listing_bomb(mnt) {
        Ok(p) => p,
        Err(e) => return (NAME, Err(e)),
    };
    let parts: Vec<Result<String, String>> = std::thread::scope(|s| {
        let mut jobs = Vec::new();
        for i in 0..16 {
            let path = format!("/workspace/{prefix}");
            jobs.push(s.spawn(move || {
                refused(&format!("list_dir {i}"), tool(h, &client(), thread, "list_dir", json!({"path": path})))
            }));
        }
        for i in 0..4 {
            let q = [("threadId", thread.to_string()), ("path", prefix.clone()), ("recursive", "1".into())];
            jobs.push(s.spawn(move || {
                refused(&format!("WebUI listing {i}"), service(client().get(h.url("/api/workspace")).query(&q)))
            }));
        }
        for i in 0..2 {
            jobs.push(s.spawn(move || {
                let req = client().get(h.url("/api/workspace/download")).query(&[("threadId", thread)]);
                refused(&format!("zip {i}"), service(req))
            }));
        }
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let parts = parts
        .into_iter()
        .map(|p| match p {
            Ok(what) if ["listing_too_large", "scope_busy"].iter().any(|c| what.contains(c)) => Ok(what),
            Ok(what) => Err(format!("{what}: not refused as a listing too large or a scope busy")),
            Err(e) => Err(e),
        })
        .collect();
    (NAME, all_ok(parts))
}

/// Builds the bomb below `mnt` through directory descriptors (its paths are longer than
/// `PATH_MAX`); the prefix, relative to the scope root.
fn listing_bomb(mnt: &Path) -> Result<String, String> {
    let name = "d".repeat(250);
    let cname = CString::new(name.as_str()).unwrap();
    let croot = CString::new(mnt.as_os_str().as_encoded_bytes()).unwrap();
    let err = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: plain open(2)/mkdirat(2)/openat(2)/close(2) on descriptors this function owns.
    unsafe {
        let mut fd = libc::open(croot.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(err("open mount root"));
        }
        for level in 0..64 {
            let next = if libc::mkdirat(fd, cname.as_ptr(), 0o755) == 0 {
                libc::openat(fd, cname.as_ptr(), libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC)
            } else {
                -1
            };
            libc::close(fd);
            if next < 0 {
                return Err(err(&format!("level {level}")));
            }
            fd = next;
        }
        for i in 0..BOMB_FILES {
            let file = CString::new(format!("{i:06}")).unwrap();
            let f = libc::openat(fd, file.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC, 0o644);
            if f < 0 {
                libc::close(fd);
                return Err(err(&format!("file {i}")));
            }
            libc::close(f);
        }
        libc::close(fd);
    }
    Ok(vec![name; 64].join("/"))
}

/// Names per directory of the zip attack: every 9-character name of `_`, `:` and `\\` (which
/// all became `_` in the zip once, the review's N3), and as many plain names beside them.
const ZIP_NAMES: usize = 19_683;

/// N3 and issue 22 acceptance c: a directory of names that once collided in the zip; clients that
/// hang up at once (the walk stops), then whole downloads of it and of as many plain names in
/// another scope, each the faster of two: every entry there, and the colliding names within twice
/// the plain names' time (the review measured 25x at 6,561 names, quadratic beyond).
pub fn n3_zip_of_colliding_names(h: &Hostile, thread: &str, mnt: &Path) -> Verdict {
    const NAME: &str = "N3 zip of 19,683 names that once collided";
    let plain_thread = "thr-zip-plain";
    let plain_mnt = h.mountpoint(&h.provision(plain_thread));
    for (root, colliding) in [(mnt.join("zip"), true), (plain_mnt.join("zip"), false)] {
        if let Err(e) = std::fs::create_dir_all(&root) {
            return (NAME, Err(format!("mkdir: {e}")));
        }
        for i in 0..ZIP_NAMES {
            let name: String = if colliding {
                (0..9).map(|k| ['_', ':', '\\'][i / 3usize.pow(k) % 3]).collect()
            } else {
                format!("n{i:08}")
            };
            if let Err(e) = std::fs::write(root.join(name), b"z") {
                return (NAME, Err(format!("creating name {i}: {e}")));
            }
        }
    }
    let download = |thread: &str, limit: Duration| {
        let c = Client::builder().timeout(limit).build().unwrap();
        let start = Instant::now();
        let r =
            c.get(h.url("/api/workspace/download")).query(&[("threadId", thread)]).bearer_auth(SERVICE_TOKEN).send();
        let body = r.and_then(|r| r.error_for_status()).and_then(|r| r.bytes());
        (body, start.elapsed())
    };
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| download(thread, Duration::from_millis(50)));
        }
    });
    let mut best = [Duration::MAX; 2];
    for _ in 0..2 {
        for (k, t) in [plain_thread, thread].into_iter().enumerate() {
            let (body, took) = download(t, ATTACK_LIMIT);
            let entries = body
                .map_err(|e| e.to_string())
                .and_then(|b| zip::ZipArchive::new(std::io::Cursor::new(b)).map_err(|e| e.to_string()))
                .map(|z| {
                    z.file_names().filter_map(Result::ok).filter(|n| n.starts_with("zip/") && !n.ends_with('/')).count()
                });
            match entries {
                Ok(n) if n == ZIP_NAMES => best[k] = best[k].min(took),
                Ok(n) => return (NAME, Err(format!("the zip of {t} holds {n} names, not {ZIP_NAMES}"))),
                Err(e) => return (NAME, Err(format!("download of {t}: {e}"))),
            }
        }
    }
    let [plain, colliding] = best;
    let verdict = if colliding > plain * 2 {
        Err(format!("colliding names took {colliding:.2?}, plain names {plain:.2?}: over twice"))
    } else {
        Ok(format!("8 clients hung up; whole zips: plain names {plain:.2?}, colliding names {colliding:.2?}"))
    };
    (NAME, verdict)
}

/// What the bystander saw.
#[derive(Debug, Default)]
pub struct Bystander {
    pub latencies: Latencies,
    pub failures: Vec<String>,
    pub rounds: u64,
}

/// The user of the bystander's signed tool calls (every attack's are `user-1`'s).
pub const BYSTANDER_USER: &str = "user-2";

/// Scope B's loop until `stop`: write and read a file through its FUSE mount, then through the
/// HTTP API, then through signed `/tools` calls (as [`BYSTANDER_USER`]), checking every byte,
/// timing every operation.
pub fn bystander(base: &str, thread: &str, mnt: PathBuf, stop: &AtomicBool) -> Bystander {
    let c = Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let mut out = Bystander::default();
    fn time(out: &mut Bystander, op: &'static str, f: &mut dyn FnMut() -> Result<(), String>) {
        let start = Instant::now();
        let r = f();
        out.latencies.0.push((op, start.elapsed()));
        if let Err(e) = r {
            if out.failures.len() < 20 {
                out.failures.push(format!("round {}: {op}: {e}", out.rounds));
            }
        }
    }
    while !stop.load(Ordering::Relaxed) || out.rounds < 10 {
        let round = out.rounds;
        let payload: Vec<u8> = (0..32 * 1024u64).map(|i| (i * 31 + round) as u8).collect();
        let file = mnt.join("bystander.bin");
        time(&mut out, "fuse_write", &mut || std::fs::write(&file, &payload).map_err(|e| e.to_string()));
        time(&mut out, "fuse_read", &mut || match std::fs::read(&file) {
            Ok(b) if b == payload => Ok(()),
            Ok(b) => Err(format!("read {} bytes that differ from the {} written", b.len(), payload.len())),
            Err(e) => Err(e.to_string()),
        });
        let q = [("threadId", thread), ("path", "bystander-http.bin")];
        time(&mut out, "http_put", &mut || {
            let r = c
                .put(format!("{base}/api/workspace/file"))
                .query(&q)
                .bearer_auth(SERVICE_TOKEN)
                .body(payload.clone())
                .send();
            match r {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(format!("status {}", r.status())),
                Err(e) => Err(e.to_string()),
            }
        });
        time(&mut out, "http_get", &mut || {
            let r = c.get(format!("{base}/api/workspace/file")).query(&q).bearer_auth(SERVICE_TOKEN).send();
            match r.map(|r| (r.status(), r.bytes())) {
                Ok((s, Ok(b))) if s.is_success() && b[..] == payload[..] => Ok(()),
                Ok((s, b)) => Err(format!(
                    "status {s}, {} bytes (want the {} written)",
                    b.map(|b| b.len()).unwrap_or(0),
                    payload.len()
                )),
                Err(e) => Err(e.to_string()),
            }
        });
        let text = format!("bystander round {round}\n");
        let signed = |name: &str, params: Value| {
            let path = format!("/tools/{name}");
            let body = signed_body_as(HMAC_SECRET, &path, BYSTANDER_USER, thread, &params, now_secs(), &fresh_nonce());
            let r = c.post(format!("{base}{path}")).header("content-type", "application/json").body(body).send();
            match r.map(|r| (r.status(), r.json::<Value>())) {
                Ok((s, Ok(v))) if s.is_success() => Ok(v),
                Ok((s, v)) => Err(format!("status {s}: {:?}", v.ok())),
                Err(e) => Err(e.to_string()),
            }
        };
        time(&mut out, "tools_write", &mut || {
            signed("write_file", json!({"path": "bystander-tools.txt", "content": text})).map(|_| ())
        });
        time(&mut out, "tools_read", &mut || match signed("read_file", json!({"path": "bystander-tools.txt"})) {
            Ok(v) if v["content"] == text.as_str() => Ok(()),
            Ok(v) => Err(format!("read back {:?}, want {text:?}", v["content"])),
            Err(e) => Err(e),
        });
        out.rounds += 1;
    }
    out
}
