//! The `/api/workspace*` routes against the real daemon (issue 3, acceptance d, e and legacy import):
//! per-thread isolation, path refusals, limits, quota, zip contents, coherence with the FUSE mount,
//! and idempotent, audited imports. Every answer is checked for physical paths (`Daemon::send`).

pub mod workspace_support;

use reqwest::StatusCode;
use serde_json::json;
use sha2::{Digest, Sha256};
use workspace_support::{Answer, Daemon, MAX_UPLOAD};

/// Every rule of the path check, as the WebUI could send them (the HTTP client percent-encodes each;
/// the daemon decodes once, so `%2e%2e` arrives literally and must be refused after a second decode).
const BAD_PATHS: &[&str] = &[
    "..",
    "../result.txt",
    "docs/../../etc/passwd",
    "%2e%2e",
    "%2e%2e%2fetc%2fpasswd",
    "a%2fb",
    "//etc/passwd",
    "/../result.txt",
    "/%2e%2e/result.txt",
    "a\\b",
    "..\\..\\windows",
    "C:",
    "c:/windows/win.ini",
    "a\nb",
    "a\u{1}b",
    "tab\there",
    "a\u{7f}",
    ".control",
    ".secrets/token",
    "__evosci_internal__/x",
    "",
];

#[test]
fn threads_keep_their_own_files_and_other_scopes_look_missing() {
    let d = Daemon::start();
    d.provision("thread-a");
    d.provision("thread-b");
    let a = d.upload("thread-a", "result.txt", b"from A".to_vec(), "");
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
    let file = &a.json()["files"][0];
    assert_eq!((file["path"].as_str(), file["virtual_path"].as_str()), (Some("result.txt"), Some("/result.txt")));
    assert_eq!(d.upload("thread-b", "result.txt", b"from B".to_vec(), "").status, StatusCode::CREATED);
    assert_eq!(d.read("thread-a", "result.txt").body, b"from A");
    assert_eq!(d.read("thread-b", "result.txt").body, b"from B");

    // A file only A has: B asking for it is a 404 exactly like a missing file or an unknown thread.
    assert_eq!(d.upload("thread-a", "only-a.txt", b"secret of A".to_vec(), "").status, StatusCode::CREATED);
    let cross = d.read("thread-b", "only-a.txt");
    let missing = d.read("thread-b", "never-existed.txt");
    let unknown = d.read("thread-nobody", "only-a.txt");
    for other in [&missing, &unknown] {
        assert_eq!((cross.status, &cross.body), (other.status, &other.body));
    }
    assert_eq!(cross.status, StatusCode::NOT_FOUND);
    assert_eq!(cross.code(), "not_found");
    let listing_b = d.listing("thread-b");
    assert_eq!(listing_b, vec![("result.txt".to_string(), "file".to_string(), 6)]);
    let del = d
        .send(d.client.delete(d.url("/api/workspace/file")).query(&[("threadId", "thread-b"), ("path", "only-a.txt")]));
    assert_eq!((del.status, del.body.clone()), (cross.status, cross.body.clone()));
    assert_eq!(d.read("thread-a", "only-a.txt").body, b"secret of A");

    // Exclusive create by default, atomic replace with overwrite=1.
    let again = d.upload("thread-a", "result.txt", b"second".to_vec(), "");
    assert_eq!((again.status, again.code().as_str()), (StatusCode::CONFLICT, "file_exists"));
    assert_eq!(d.upload("thread-a", "result.txt", b"second".to_vec(), "&overwrite=1").status, StatusCode::CREATED);
    assert_eq!(d.read("thread-a", "result.txt").body, b"second");
    assert_eq!(d.read("thread-b", "result.txt").body, b"from B");

    // Usage counts only the scope's own files.
    let usage = d.usage("thread-b");
    assert_eq!((usage["files"].as_u64(), usage["bytes"].as_u64()), (Some(1), Some(6)));
    assert_eq!(usage["quota"]["bytes"].as_u64(), Some(workspace_support::QUOTA));

    // Delete.
    let del = d
        .send(d.client.delete(d.url("/api/workspace/file")).query(&[("threadId", "thread-a"), ("path", "only-a.txt")]));
    assert_eq!(del.status, StatusCode::NO_CONTENT);
    assert_eq!(d.read("thread-a", "only-a.txt").status, StatusCode::NOT_FOUND);

    // threadId: missing or malformed is 400 without touching anything.
    assert_eq!(d.get("/api/workspace/usage").status, StatusCode::BAD_REQUEST);
    let bad = d.send(d.client.get(d.url("/api/workspace")).query(&[("threadId", "../thread-a")]));
    assert_eq!((bad.status, bad.code().as_str()), (StatusCode::BAD_REQUEST, "invalid_thread_id"));
    // No token: 401.
    let r = d.client.get(d.url("/api/workspace?threadId=thread-a")).send().unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

#[test]
fn bad_paths_are_refused_with_400_and_nothing_is_touched() {
    let d = Daemon::start();
    d.provision("thread-p");
    assert_eq!(d.upload("thread-p", "result.txt", b"keep me".to_vec(), "").status, StatusCode::CREATED);
    let before = (d.listing("thread-p"), d.usage("thread-p"));
    let q = |p: &str| vec![("threadId", "thread-p".to_string()), ("path", p.to_string())];
    for &bad in BAD_PATHS {
        let answers: Vec<(&str, Answer)> = vec![
            ("read", d.send(d.client.get(d.url("/api/workspace/file")).query(&q(bad)))),
            ("put", d.send(d.client.put(d.url("/api/workspace/file")).query(&q(bad)).body("overwritten"))),
            ("delete", d.send(d.client.delete(d.url("/api/workspace/file")).query(&q(bad)))),
            ("upload", d.upload("thread-p", bad, b"x".to_vec(), "")),
        ];
        for (what, a) in answers {
            assert_eq!(a.status, StatusCode::BAD_REQUEST, "{what} {bad:?}: {}", a.text());
        }
        if !bad.is_empty() {
            // The empty path is the root for a listing; every other bad path is refused there too.
            let list = d.send(d.client.get(d.url("/api/workspace")).query(&q(bad)));
            assert_eq!(list.status, StatusCode::BAD_REQUEST, "list {bad:?}");
            let dir = format!("&dir={}", utf8_query(bad));
            assert_eq!(
                d.upload("thread-p", "ok.txt", b"x".to_vec(), &dir).status,
                StatusCode::BAD_REQUEST,
                "dir {bad:?}"
            );
        }
    }
    // The same traversal written raw in the URL (decoded once by the HTTP layer).
    for raw in ["path=%2e%2e%2fetc%2fpasswd", "path=%2E%2E", "path=%252e%252e", "path=..%5cx", "path=%2f%2fetc"] {
        let a = d.get(&format!("/api/workspace/file?threadId=thread-p&{raw}"));
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{raw}: {}", a.text());
        assert_eq!(a.code(), "invalid_path");
    }
    assert_eq!((d.listing("thread-p"), d.usage("thread-p")), before, "a refused request changed the workspace");
    assert_eq!(d.read("thread-p", "result.txt").body, b"keep me");
}

/// A `virtual_path` the API answers with (`/docs/paper.md`) is taken back as `path` (and as a
/// listing's `path` or an upload's `dir`) by every route, naming the same file (seed 003 §3.3).
#[test]
fn virtual_paths_the_api_returns_are_accepted_as_paths() {
    let d = Daemon::start();
    d.provision("thread-v");
    let up = d.upload("thread-v", "paper.md", b"v1".to_vec(), "&dir=docs");
    assert_eq!(up.status, StatusCode::CREATED, "{}", up.text());
    let vp = up.json()["files"][0]["virtual_path"].as_str().unwrap().to_string();
    assert_eq!(vp, "/docs/paper.md");
    let q = |p: &str| vec![("threadId", "thread-v".to_string()), ("path", p.to_string())];
    assert_eq!(d.read("thread-v", &vp).body, b"v1");
    let put = d.send(d.client.put(d.url("/api/workspace/file")).query(&q(&vp)).body("v2"));
    assert!(put.status.is_success(), "{}", put.text());
    assert_eq!(d.read("thread-v", "docs/paper.md").body, b"v2", "the same file, not a second one");
    let list = d.send(d.client.get(d.url("/api/workspace")).query(&q("/docs")));
    assert_eq!(list.status, StatusCode::OK, "{}", list.text());
    assert_eq!(list.json()["entries"][0]["virtual_path"], "/docs/paper.md");
    let root = d.send(d.client.get(d.url("/api/workspace")).query(&q("/")));
    assert_eq!(root.json()["entries"][0]["virtual_path"], "/docs");
    let into = d.upload("thread-v", "more.md", b"m".to_vec(), "&dir=%2Fdocs");
    assert_eq!(into.json()["files"][0]["virtual_path"], "/docs/more.md", "{}", into.text());
    let del = d.send(d.client.delete(d.url("/api/workspace/file")).query(&q(&vp)));
    assert!(del.status.is_success(), "{}", del.text());
    assert_eq!(d.read("thread-v", "docs/paper.md").status, StatusCode::NOT_FOUND);
}

/// Percent-encodes a value for a hand-written query string.
fn utf8_query(v: &str) -> String {
    v.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

#[test]
fn uploads_over_the_limit_are_413_and_leave_nothing() {
    let d = Daemon::start();
    d.provision("thread-l");
    let big = vec![7u8; MAX_UPLOAD + 1];
    let a = d.upload("thread-l", "big.bin", big.clone(), "");
    assert_eq!((a.status, a.code().as_str()), (StatusCode::PAYLOAD_TOO_LARGE, "too_large"), "{}", a.text());
    // Declared length over the limit, and a chunked body that turns out too large.
    assert_eq!(d.put("thread-l", "big.bin", big.clone()).status, StatusCode::PAYLOAD_TOO_LARGE);
    let chunked = reqwest::blocking::Body::new(std::io::Cursor::new(big.clone()));
    let a = d.send(
        d.client
            .put(d.url("/api/workspace/file"))
            .query(&[("threadId", "thread-l"), ("path", "dir/big.bin")])
            .body(chunked),
    );
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", a.text());
    assert!(d.listing("thread-l").iter().all(|(p, kind, _)| !p.ends_with("big.bin") && (kind == "directory")));
    assert_eq!(d.usage("thread-l")["bytes"].as_u64(), Some(0));
    // Exactly the limit is fine.
    assert_eq!(d.upload("thread-l", "max.bin", vec![1u8; MAX_UPLOAD], "").status, StatusCode::CREATED);
    // No partial file appears in the mount either.
    let scope = d.provision("thread-l");
    let mnt = d.mountpoint(&scope);
    assert!(!mnt.join("big.bin").exists());
    assert!(!mnt.join("dir/big.bin").exists());
}

/// A declared length far beyond what the daemon drains: the 413 comes at once, before any body
/// byte is sent, and says `Connection: close` so no client reuses the connection.
#[test]
fn a_declared_length_far_over_the_limit_is_413_at_once_with_connection_close() {
    use std::io::{Read, Write};
    let d = Daemon::start();
    d.provision("thread-f");
    let addr = d.base.trim_start_matches("http://").to_owned();
    let mut conn = std::net::TcpStream::connect(&addr).expect("connect");
    conn.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let head = format!(
        "PUT /api/workspace/file?threadId=thread-f&path=huge.bin HTTP/1.1\r\nHost: {addr}\r\n\
         Authorization: Bearer {}\r\nContent-Length: 10000000000\r\n\r\n",
        workspace_support::TOKEN
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(&[0u8; 4096]).unwrap();
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).expect("the daemon answers and closes");
    let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 413"), "{answer}");
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
    assert!(answer.contains("too_large"), "{answer}");
    assert!(d.listing("thread-f").iter().all(|(p, _, _)| !p.ends_with("huge.bin")));
}

#[test]
fn quota_is_507_and_leaves_nothing() {
    let d = Daemon::start();
    d.provision("thread-q");
    for name in ["one.bin", "two.bin"] {
        assert_eq!(d.upload("thread-q", name, vec![1u8; MAX_UPLOAD], "").status, StatusCode::CREATED);
    }
    let a = d.upload("thread-q", "three.bin", vec![1u8; MAX_UPLOAD], "");
    assert_eq!((a.status, a.code().as_str()), (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded"), "{}", a.text());
    let p = d.put("thread-q", "three.bin", vec![1u8; MAX_UPLOAD]);
    assert_eq!(p.status, StatusCode::INSUFFICIENT_STORAGE);
    let names: Vec<String> = d.listing("thread-q").into_iter().map(|r| r.0).collect();
    assert_eq!(names, vec!["one.bin", "two.bin"]);
    assert_eq!(d.usage("thread-q")["bytes"].as_u64(), Some(2 * MAX_UPLOAD as u64));
}

#[test]
fn range_reads_and_downloads() {
    let d = Daemon::start();
    d.provision("thread-r");
    assert_eq!(d.upload("thread-r", "report.pdf", b"%PDF-1.7 body".to_vec(), "").status, StatusCode::CREATED);
    let q = [("threadId", "thread-r"), ("path", "report.pdf")];
    let get = |range: Option<&str>, download: bool| {
        let mut req = d.client.get(d.url("/api/workspace/file")).query(&q);
        if download {
            req = req.query(&[("download", "1")]);
        }
        if let Some(r) = range {
            req = req.header("range", r);
        }
        d.send(req)
    };
    let whole = get(None, false);
    assert_eq!((whole.status, whole.body.as_slice()), (StatusCode::OK, &b"%PDF-1.7 body"[..]));
    assert_eq!(whole.header("content-type"), "application/pdf");
    assert_eq!(whole.header("accept-ranges"), "bytes");
    assert!(whole.header("content-disposition").starts_with("inline;"));
    let part = get(Some("bytes=0-3"), false);
    assert_eq!((part.status, part.body.as_slice()), (StatusCode::PARTIAL_CONTENT, &b"%PDF"[..]));
    assert_eq!(part.header("content-range"), "bytes 0-3/13");
    let tail = get(Some("bytes=-4"), false);
    assert_eq!((tail.status, tail.body.as_slice()), (StatusCode::PARTIAL_CONTENT, &b"body"[..]));
    let out = get(Some("bytes=13-"), false);
    assert_eq!(out.status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(out.header("content-range"), "bytes */13");
    let dl = get(None, true);
    assert_eq!(dl.header("content-disposition"), "attachment; filename=\"report.pdf\"; filename*=UTF-8''report%2Epdf");
    // A directory is not a file.
    assert_eq!(d.put("thread-r", "docs/a.md", b"# a".to_vec()).status, StatusCode::OK);
    assert_eq!(d.read("thread-r", "docs").status, StatusCode::CONFLICT);
    let sub = d.send(d.client.get(d.url("/api/workspace")).query(&[("threadId", "thread-r"), ("path", "docs")]));
    assert_eq!(sub.json()["entries"][0]["virtual_path"], "/docs/a.md");
}

#[test]
fn the_zip_holds_only_the_scopes_files_and_never_a_symlink_target() {
    let d = Daemon::start();
    let scope = d.provision("thread-z");
    let other = d.provision("thread-other");
    assert_eq!(d.upload("thread-other", "other.txt", b"not yours".to_vec(), "").status, StatusCode::CREATED);
    assert_eq!(d.upload("thread-z", "result.txt", b"mine".to_vec(), "").status, StatusCode::CREATED);
    assert_eq!(d.put("thread-z", "data/x.txt", b"target bytes".to_vec()).status, StatusCode::OK);
    let mnt = d.mountpoint(&scope);
    std::os::unix::fs::symlink("data/x.txt", mnt.join("link")).expect("symlink through the mount");
    std::os::unix::fs::symlink("data", mnt.join("dirlink")).expect("directory symlink through the mount");
    // Any target is allowed (SPEC §6): to a host file, to another scope's mount, above the root.
    let other_mnt = d.mountpoint(&other);
    std::os::unix::fs::symlink("/etc/hostname", mnt.join("host")).expect("absolute symlink through the mount");
    std::os::unix::fs::symlink(&other_mnt, mnt.join("other")).expect("symlink to another scope");
    std::os::unix::fs::symlink("../../..", mnt.join("up")).expect("symlink above the root");
    // The API lists symlinks as such and never reads through them.
    let rows = d.listing("thread-z");
    assert!(rows.contains(&("link".to_string(), "symlink".to_string(), 0)), "{rows:?}");
    assert_eq!(d.read("thread-z", "link").status, StatusCode::NOT_FOUND);
    assert_eq!(d.read("thread-z", "dirlink/x.txt").status, StatusCode::NOT_FOUND);
    for path in ["host", "other/other.txt", "up/etc/hostname"] {
        assert_eq!(d.read("thread-z", path).status, StatusCode::NOT_FOUND, "{path}");
    }

    let entries = d.zip_entries("thread-z");
    let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec!["data/", "data/x.txt", "result.txt"]);
    assert_eq!(entries[1].1, b"target bytes");
    assert_eq!(entries[2].1, b"mine");
    let other: Vec<String> = d.zip_entries("thread-other").into_iter().map(|(n, _)| n).collect();
    assert_eq!(other, vec!["other.txt"]);
}

#[test]
fn api_writes_are_seen_through_the_mount_at_once_and_mount_writes_by_get() {
    let d = Daemon::start();
    let scope = d.provision("thread-c");
    let mnt = d.mountpoint(&scope);
    // The kernel caches entries, attributes and pages for 60 s here (production TTL).
    assert_eq!(d.upload("thread-c", "notes.txt", b"old content".to_vec(), "").status, StatusCode::CREATED);
    assert_eq!(std::fs::read(mnt.join("notes.txt")).unwrap(), b"old content");
    assert_eq!(std::fs::metadata(mnt.join("notes.txt")).unwrap().len(), 11);
    assert_eq!(std::fs::read(mnt.join("notes.txt")).unwrap(), b"old content");

    assert_eq!(d.put("thread-c", "notes.txt", b"new content, longer".to_vec()).status, StatusCode::OK);
    assert_eq!(std::fs::metadata(mnt.join("notes.txt")).unwrap().len(), 19);
    assert_eq!(std::fs::read(mnt.join("notes.txt")).unwrap(), b"new content, longer");

    // Replace with overwrite=1 through upload, shorter this time.
    assert_eq!(d.upload("thread-c", "notes.txt", b"v3".to_vec(), "&overwrite=1").status, StatusCode::CREATED);
    assert_eq!(std::fs::read(mnt.join("notes.txt")).unwrap(), b"v3");

    // A listing cached by the kernel shows new files and directories made through the API.
    let names = |p: &std::path::Path| {
        let mut v: Vec<String> =
            std::fs::read_dir(p).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&mnt), vec!["notes.txt"]);
    assert!(!mnt.join("sub").exists());
    assert_eq!(d.put("thread-c", "sub/deep.txt", b"deep".to_vec()).status, StatusCode::OK);
    assert_eq!(names(&mnt), vec!["notes.txt", "sub"]);
    assert_eq!(std::fs::read(mnt.join("sub/deep.txt")).unwrap(), b"deep");

    // Deleting through the API removes the cached entry at once.
    let del =
        d.send(d.client.delete(d.url("/api/workspace/file")).query(&[("threadId", "thread-c"), ("path", "notes.txt")]));
    assert_eq!(del.status, StatusCode::NO_CONTENT);
    assert!(!mnt.join("notes.txt").exists());
    let del = d.send(d.client.delete(d.url("/api/workspace/file")).query(&[
        ("threadId", "thread-c"),
        ("path", "sub"),
        ("recursive", "1"),
    ]));
    assert_eq!(del.status, StatusCode::NO_CONTENT);
    assert!(!mnt.join("sub").exists());
    assert!(names(&mnt).is_empty());

    // The other way: what is written through the mount is returned by GET at once.
    std::fs::write(mnt.join("from-mount.txt"), b"written in the container").unwrap();
    assert_eq!(d.read("thread-c", "from-mount.txt").body, b"written in the container");
    std::fs::write(mnt.join("from-mount.txt"), b"rewritten").unwrap();
    assert_eq!(d.read("thread-c", "from-mount.txt").body, b"rewritten");
    std::fs::create_dir(mnt.join("made")).unwrap();
    std::fs::write(mnt.join("made/f.txt"), b"f").unwrap();
    let rows = d.listing("thread-c");
    assert!(rows.contains(&("made/f.txt".to_string(), "file".to_string(), 1)), "{rows:?}");
    std::fs::remove_file(mnt.join("from-mount.txt")).unwrap();
    assert_eq!(d.read("thread-c", "from-mount.txt").status, StatusCode::NOT_FOUND);
    assert!(!d.log_text().contains("invalidation failed"), "{}", d.log_text());
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn import(d: &Daemon, thread: &str, body: serde_json::Value) -> Answer {
    d.send(d.client.post(d.url(&format!("/api/workspace/import?threadId={thread}"))).json(&body))
}

#[test]
fn legacy_import_copies_once_with_an_audit_record_and_never_leaves_the_legacy_root() {
    let d = Daemon::start();
    let scope = d.provision("thread-i");
    d.provision("thread-j");
    let legacy = d.legacy.clone();
    std::fs::create_dir_all(legacy.join("reports")).unwrap();
    std::fs::write(legacy.join("reports/r.txt"), b"legacy report").unwrap();
    std::fs::create_dir_all(legacy.join(".evoscientist")).unwrap();
    std::fs::write(legacy.join(".evoscientist/state.json"), b"{}").unwrap();
    std::fs::write(legacy.join("big.bin"), vec![0u8; MAX_UPLOAD + 1]).unwrap();
    let outside = d.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), b"host secret").unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), legacy.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(&outside, legacy.join("dirlink")).unwrap();
    std::os::unix::fs::symlink("reports/r.txt", legacy.join("rel-link.txt")).unwrap();

    let body = json!({"source_path": "reports/r.txt", "target_path": "imported/r.txt", "idempotency_key": "imp-1"});
    let first = import(&d, "thread-i", body.clone());
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    let v = first.json();
    assert_eq!(v["virtual_path"], "/imported/r.txt");
    assert_eq!(v["sha256"], sha256_hex(b"legacy report"));
    assert_eq!((v["size"].as_u64(), v["replayed"].as_bool()), (Some(13), Some(false)));
    assert_eq!(d.read("thread-i", "imported/r.txt").body, b"legacy report");

    // The same key again: the same result, no second copy (a later edit survives).
    assert_eq!(d.put("thread-i", "imported/r.txt", b"edited after import".to_vec()).status, StatusCode::OK);
    let again = import(&d, "thread-i", body.clone());
    assert_eq!(again.status, StatusCode::OK);
    let w = again.json();
    for k in ["sha256", "size", "path", "source_path", "imported_at", "idempotency_key"] {
        assert_eq!(v[k], w[k], "{k}");
    }
    assert_eq!(w["replayed"], true);
    assert_eq!(d.read("thread-i", "imported/r.txt").body, b"edited after import");
    // The key reused for another request conflicts.
    let other = import(&d, "thread-i", json!({"source_path": "big.bin", "idempotency_key": "imp-1"}));
    assert_eq!((other.status, other.code().as_str()), (StatusCode::CONFLICT, "idempotency_key_conflict"));
    // Keys are per scope; another thread imports into its own scope only.
    let j = import(&d, "thread-j", body.clone());
    assert_eq!(j.status, StatusCode::CREATED);
    assert_eq!(d.read("thread-j", "imported/r.txt").body, b"legacy report");
    assert_eq!(d.read("thread-i", "imported/r.txt").body, b"edited after import");

    // The audit record.
    let registry = std::sync::Arc::new(
        scopefs::registry::Registry::open(&d.dir.path().join("data/control/registry.sqlite3")).unwrap(),
    );
    let scope_id = scopefs::ids::ScopeId::parse(&scope).unwrap();
    let rec = registry.deployment("default").get_import(&scope_id, "imp-1").unwrap().expect("an audit record");
    assert_eq!(rec.request.source_path, "reports/r.txt");
    assert_eq!(rec.request.target_path, "imported/r.txt");
    assert_eq!(rec.sha256.as_deref(), Some(sha256_hex(b"legacy report").as_str()));
    assert!(rec.completed_at.is_some());
    // Issue 24, item 8: the records are listed through the API, oldest first, by pages.
    let second =
        json!({"source_path": "reports/r.txt", "target_path": "imported/r-list.txt", "idempotency_key": "imp-list"});
    assert_eq!(import(&d, "thread-i", second).status, StatusCode::CREATED);
    let list = |query: &str| d.send(d.client.get(d.url(&format!("/api/workspace/imports?threadId=thread-i{query}"))));
    let all = list("").json();
    let keys: Vec<&str> =
        all["imports"].as_array().unwrap().iter().filter_map(|i| i["idempotency_key"].as_str()).collect();
    assert_eq!(keys, vec!["imp-1", "imp-list"], "{all}");
    assert_eq!((all["imports"][0]["state"].as_str(), &all["imports"][0]["sha256"]), (Some("completed"), &v["sha256"]));
    let page = list("&limit=1").json();
    assert_eq!((page["imports"].as_array().map(Vec::len), page["next_after"].as_str()), (Some(1), Some("imp-1")));
    let rest = list("&limit=1&after=imp-1").json();
    assert_eq!(rest["imports"][0]["idempotency_key"], "imp-list", "{rest}");
    assert_eq!(list("&limit=0").status, StatusCode::BAD_REQUEST);

    // Symlinks are never followed, not even inside the legacy root; hidden control data is not importable.
    for (i, src) in
        ["link.txt", "dirlink/secret.txt", "rel-link.txt", ".evoscientist/state.json", "missing.txt", "reports"]
            .iter()
            .enumerate()
    {
        let a = import(
            &d,
            "thread-i",
            json!({"source_path": src, "target_path": format!("x{i}"), "idempotency_key": format!("bad-{i}")}),
        );
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{src}: {}", a.text());
        assert!(registry.deployment("default").get_import(&scope_id, &format!("bad-{i}")).unwrap().is_none(), "{src}");
    }
    for bad in ["../outside/secret.txt", "/etc/passwd", "%2e%2e/outside", "reports\\r.txt", "C:/x"] {
        let a = import(&d, "thread-i", json!({"source_path": bad, "idempotency_key": "bad-path"}));
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let a = import(
        &d,
        "thread-i",
        json!({"source_path": "reports/r.txt", "target_path": "../x", "idempotency_key": "bad-t"}),
    );
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    let a = import(&d, "thread-i", json!({"source_path": "reports/r.txt", "idempotency_key": "no spaces"}));
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    // Too large: 413, no file, and the key stays free.
    let a = import(&d, "thread-i", json!({"source_path": "big.bin", "idempotency_key": "imp-big"}));
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(d.read("thread-i", "big.bin").status, StatusCode::NOT_FOUND);
    assert!(registry.deployment("default").get_import(&scope_id, "imp-big").unwrap().is_none());
    // An existing target is kept unless overwrite is asked for.
    let a = import(
        &d,
        "thread-i",
        json!({"source_path": "reports/r.txt", "target_path": "imported/r.txt", "idempotency_key": "imp-2"}),
    );
    assert_eq!((a.status, a.code().as_str()), (StatusCode::CONFLICT, "file_exists"));
    let a = import(
        &d,
        "thread-i",
        json!({"source_path": "reports/r.txt", "target_path": "imported/r.txt", "idempotency_key": "imp-3", "overwrite": true}),
    );
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(d.read("thread-i", "imported/r.txt").body, b"legacy report");
    // Unknown thread: the usual 404.
    assert_eq!(import(&d, "thread-none", body).status, StatusCode::NOT_FOUND);
    // Nothing outside the scope was written: the legacy root is unchanged.
    let mut legacy_names: Vec<String> =
        std::fs::read_dir(&legacy).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    legacy_names.sort();
    assert_eq!(legacy_names, vec![".evoscientist", "big.bin", "dirlink", "link.txt", "rel-link.txt", "reports"]);
}

#[test]
fn a_deleting_scope_refuses_file_work_with_409() {
    let d = Daemon::start_with_env(&[("SCOPEFS_DELETE_DRAIN_SECS", "1")]);
    let scope = d.provision("thread-del");
    assert_eq!(d.upload("thread-del", "kept.txt", b"k".to_vec(), "").status, StatusCode::CREATED);
    // An owner that never settles keeps the scope in `deleting`.
    let owner = d.send(
        d.client
            .post(d.url(&format!("/internal/workspace-scopes/{scope}/owners")))
            .json(&json!({"owner_type": "cron", "resource_id": "cron-1"})),
    );
    assert!(owner.status.is_success(), "{}", owner.text());
    let owner_id = owner.json()["owner_id"].as_str().unwrap().to_string();
    let act = d.send(
        d.client
            .patch(d.url(&format!("/internal/workspace-scopes/{scope}/owners/{owner_id}")))
            .json(&json!({"state": "active"})),
    );
    assert!(act.status.is_success(), "{}", act.text());
    let rev = d.get("/internal/workspace-scopes/by-thread/thread-del").json()["revision"].as_u64().unwrap();
    let del = d.send(
        d.client
            .patch(d.url(&format!("/internal/workspace-scopes/{scope}")))
            .json(&json!({"expected_revision": rev, "state": "deleting"})),
    );
    assert!(del.status.is_success(), "{}", del.text());
    assert_eq!(d.get("/internal/workspace-scopes/by-thread/thread-del").json()["state"], "deleting");
    for a in [
        d.put("thread-del", "new.txt", b"x".to_vec()),
        d.upload("thread-del", "new.txt", b"x".to_vec(), ""),
        d.send(
            d.client.delete(d.url("/api/workspace/file")).query(&[("threadId", "thread-del"), ("path", "kept.txt")]),
        ),
    ] {
        assert_eq!((a.status, a.code().as_str()), (StatusCode::CONFLICT, "scope_deleting"), "{}", a.text());
    }
}

/// Review L1: names made in a container (through the mount) with `\`, `:` or bytes that are not
/// UTF-8, and setuid modes, reach the zip as safe, distinct names without special mode bits, and
/// the archive is whole.
#[test]
fn zip_names_and_modes_are_safe_for_any_extractor() {
    use std::ffi::OsStr;
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;

    let d = Daemon::start();
    let scope = d.provision("thread-zipnames");
    assert_eq!(d.put("thread-zipnames", "plain.txt", b"plain".to_vec()).status, StatusCode::OK);
    let mnt = d.mountpoint(&scope);
    let make = |name: &[u8], content: &[u8]| std::fs::write(mnt.join(OsStr::from_bytes(name)), content).unwrap();
    make(b"..\\..\\AppData\\x.bat", b"windows");
    make(b"C:evil", b"drive");
    make(b"\xff", b"ff");
    make(b"\xfe", b"fe");
    make(b"a_b", b"underscore");
    make(b"a\\b", b"backslash");
    make(b"suid", b"suid");
    std::fs::set_permissions(mnt.join("suid"), std::fs::Permissions::from_mode(0o6755)).unwrap();
    std::fs::create_dir(mnt.join(OsStr::from_bytes(b"dir\xff"))).unwrap();
    make(b"dir\xff/inner", b"inner");

    let a = d.get("/api/workspace/download?threadId=thread-zipnames");
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(a.body)).expect("a whole zip");
    let mut entries = Vec::new();
    for i in 0..zip.len() {
        let mut f = zip.by_index(i).unwrap();
        let name = f.name().expect("UTF-8 names").to_string();
        let mode = f.unix_mode().unwrap_or(0);
        let mut content = Vec::new();
        f.read_to_end(&mut content).unwrap();
        assert_eq!(mode & 0o7000, 0, "{name} keeps special mode bits: {mode:o}");
        assert!(!name.contains('\\') && !name.contains(':'), "unsafe name {name:?}");
        assert!(!name.split('/').any(|c| c == ".."), "{name:?}");
        entries.push((name, String::from_utf8(content).unwrap()));
    }
    entries.sort();
    let got = |content: &str| entries.iter().filter(|(_, c)| c == content).map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(got("windows"), vec!["..%5C..%5CAppData%5Cx.bat".to_string()]);
    assert_eq!(got("drive"), vec!["C%3Aevil".to_string()]);
    assert_eq!(got("ff"), vec!["%FF".to_string()]);
    assert_eq!(got("fe"), vec!["%FE".to_string()]);
    assert_eq!(got("inner"), vec!["dir%FF/inner".to_string()]);
    // The escaping is injective: `a\b` and `a_b` stay apart without a suffix.
    assert_eq!(got("underscore"), vec!["a_b".to_string()]);
    assert_eq!(got("backslash"), vec!["a%5Cb".to_string()]);
    assert_eq!(got("suid"), vec!["suid".to_string()]);
    assert_eq!(got("plain"), vec!["plain.txt".to_string()]);
    let names: std::collections::BTreeSet<_> = entries.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names.len(), entries.len(), "duplicate names: {entries:?}");
}

/// Review N3: names that differ only in `_`, `:` and `\\` (which all became `_` once, and then
/// searched for a free `~N` suffix, quadratic in their number) each go into the zip once, under
/// their own escaped name, with their own bytes. The two downloads' times are printed beside
/// those of as many plain names (a linear walk makes them alike; the old one took 25x).
#[test]
fn a_zip_of_names_that_once_collided_holds_each_name_once_under_its_own_escape() {
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;

    let d = Daemon::start();
    let mut expected = std::collections::BTreeMap::new();
    let mut seconds = Vec::new();
    for (thread, colliding) in [("thread-zipplain", false), ("thread-zipcollide", true)] {
        let scope = d.provision(thread);
        let dir = d.mountpoint(&scope).join("z");
        std::fs::create_dir(&dir).unwrap();
        let mut want = std::collections::BTreeMap::new();
        for i in 0..3usize.pow(8) {
            let name: Vec<u8> = if colliding {
                (0..8).map(|k| [b'_', b':', b'\\'][i / 3usize.pow(k) % 3]).collect()
            } else {
                format!("n{i:07}").into_bytes()
            };
            let escaped: String =
                name.iter()
                    .map(|&b| {
                        if b == b'_' || b.is_ascii_alphanumeric() {
                            (b as char).to_string()
                        } else {
                            format!("%{b:02X}")
                        }
                    })
                    .collect();
            std::fs::write(dir.join(std::ffi::OsStr::from_bytes(&name)), i.to_string()).unwrap();
            want.insert(format!("z/{escaped}"), i.to_string());
        }
        let started = std::time::Instant::now();
        let a = d.get(&format!("/api/workspace/download?threadId={thread}"));
        seconds.push(started.elapsed().as_secs_f64());
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        let mut zip = zip::ZipArchive::new(std::io::Cursor::new(a.body)).expect("a whole zip");
        let mut got = std::collections::BTreeMap::new();
        for i in 0..zip.len() {
            let mut f = zip.by_index(i).unwrap();
            if f.is_dir() {
                continue;
            }
            let name = f.name().expect("UTF-8 names").to_string();
            let mut content = String::new();
            f.read_to_string(&mut content).unwrap();
            assert!(got.insert(name.clone(), content).is_none(), "{name} twice");
        }
        assert_eq!(got, want, "{thread}");
        expected.insert(thread, got.len());
    }
    assert_eq!(expected.values().copied().collect::<Vec<_>>(), vec![6561, 6561]);
    println!("zip of 6561 plain names: {:.2} s; of 6561 names that once collided: {:.2} s", seconds[0], seconds[1]);
}

/// Sends `GET path_and_query` with the service token on a raw connection and reads only the
/// status line (the body is left unread, so a streaming answer stays in flight); returns the
/// status code and the open connection.
fn start_unread_get(d: &Daemon, path_and_query: &str) -> (u16, std::net::TcpStream) {
    use std::io::{BufRead, Write};
    let addr = d.base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let token = workspace_support::TOKEN;
    write!(s, "GET {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n").unwrap();
    let mut line = String::new();
    std::io::BufReader::new(s.try_clone().unwrap()).read_line(&mut line).unwrap();
    let code = line.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, s)
}

#[test]
fn streams_a_client_leaves_unread_hold_their_scopes_slots_and_no_other_scopes() {
    const BIG: usize = 48 * 1024 * 1024;
    let d = Daemon::start_with_env(&[
        ("SCOPEFS_LIMITS_MAX_INFLIGHT_PER_SCOPE", "2"),
        ("SCOPEFS_QUOTA_BYTES", "268435456"),
        ("SCOPEFS_MAX_UPLOAD_BYTES", "67108864"),
    ]);
    for thread in ["thr-stream-a", "thr-stream-b"] {
        d.provision(thread);
        let a = d.put(thread, "big.bin", vec![7u8; BIG]);
        assert!(a.status.is_success(), "{}", a.text());
    }
    let file = |thread: &str| format!("/api/workspace/file?threadId={thread}&path=big.bin");
    // Two downloads of scope A that nobody reads: each holds one of A's two slots.
    let held: Vec<_> = (0..2).map(|_| start_unread_get(&d, &file("thr-stream-a"))).collect();
    assert!(held.iter().all(|(code, _)| *code == 200));
    // A third stream of A (a download or the zip) is refused at once; scope B is served in full.
    let third = d.get(&file("thr-stream-a"));
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS, "{}", third.text());
    let zip = d.get("/api/workspace/download?threadId=thr-stream-a");
    assert_eq!(zip.status, StatusCode::TOO_MANY_REQUESTS, "{}", zip.text());
    let other = d.get(&file("thr-stream-b"));
    assert_eq!((other.status, other.body.len()), (StatusCode::OK, BIG));
    // The client goes away: A's slots come back.
    drop(held);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let again = d.get(&file("thr-stream-a"));
        if again.status == StatusCode::OK {
            assert_eq!(again.body.len(), BIG);
            break;
        }
        assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(std::time::Instant::now() < deadline, "scope A's slots never came back");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Ten versions of a file written and fsynced through the mount: nine blocks no file uses.
fn rewrite_ten_times(d: &Daemon, thread: &str) -> Vec<u8> {
    let scope = d.provision(thread);
    let mnt = d.mountpoint(&scope);
    let mut last = Vec::new();
    for v in 0..10u8 {
        last = (0..100_000u32).map(|i| (i as u8).wrapping_mul(7).wrapping_add(v)).collect();
        let mut f = std::fs::File::create(mnt.join("data.bin")).unwrap();
        std::io::Write::write_all(&mut f, &last).unwrap();
        f.sync_all().unwrap();
    }
    last
}

/// Waits until the wall clock is in a later second: with metadata shipping (the default), a
/// pass takes only blocks unreferenced before the second it starts in.
fn next_second() {
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let (start, deadline) = (now(), std::time::Instant::now() + std::time::Duration::from_secs(3));
    while now() <= start {
        assert!(std::time::Instant::now() < deadline, "the clock did not move on");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn metric(d: &Daemon, name: &str) -> u64 {
    let text = d.get("/metrics").text();
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} sample in /metrics:\n{text}"))
}

/// Issue 24 item 7: gc runs in the daemon while the scope stays mounted, on request
/// (`POST /internal/workspace-scopes/{scope_id}/gc`) and every `gc.interval_secs`; the file keeps
/// its last version and the blocks of the nine before it are deleted.
#[test]
fn the_daemon_collects_garbage_online_on_request_and_on_its_interval() {
    let d = Daemon::start_with_env(&[("SCOPEFS_GC_GRACE_SECS", "0"), ("SCOPEFS_GC_INTERVAL_SECS", "0")]);
    let last = rewrite_ten_times(&d, "thread-gc");
    next_second();
    let scope =
        d.get("/internal/workspace-scopes/by-thread/thread-gc").json()["scope_id"].as_str().unwrap().to_string();
    let gc = |scope: &str| d.send(d.client.post(d.url(&format!("/internal/workspace-scopes/{scope}/gc"))));
    let a = gc(&scope);
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(a.json()["blocks_deleted"], 9, "{}", a.text());
    assert_eq!(a.json()["blocks_deferred"], 0, "{}", a.text());
    assert_eq!(d.read("thread-gc", "data.bin").body, last);
    assert_eq!(gc(&scope).json()["blocks_deleted"], 0, "nothing left to take");
    assert_eq!(metric(&d, "scopefs_gc_blocks_deleted_total"), 9);
    let unknown = gc("00000000-0000-7000-8000-000000000000");
    assert_eq!(
        (unknown.status, unknown.code().as_str()),
        (StatusCode::NOT_FOUND, "scope_not_found"),
        "{}",
        unknown.text()
    );
    drop(d);

    let d = Daemon::start_with_env(&[("SCOPEFS_GC_GRACE_SECS", "0"), ("SCOPEFS_GC_INTERVAL_SECS", "1")]);
    let last = rewrite_ten_times(&d, "thread-gc-loop");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while metric(&d, "scopefs_gc_blocks_deleted_total") < 9 {
        assert!(std::time::Instant::now() < deadline, "the daemon's passes did not reclaim the nine blocks");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(metric(&d, "scopefs_gc_passes_total") >= 1);
    assert_eq!(d.read("thread-gc-loop", "data.bin").body, last);
}
