//! Issue 23 acceptance e: forks and snapshots through the daemon. A fork of a scope holding 1 GiB in
//! 10,000 files uploads no block and copies its files as they were (its time is printed: speed
//! goals live in benchmarks); writing in the fork never changes the parent; deleting and purging
//! the parent leaves the fork intact (every block it names is checked by `scopefs fsck`); a block
//! both shared is deleted only once neither refers to it. Snapshots: taken, listed, read through
//! the file API, restored into their scope.
//!
//! Needs root and /dev/fuse (the mounts); a missing prerequisite fails the test.

pub mod serve_process;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use serde_json::{json, Value};
use serve_process::*;
use sha2::{Digest, Sha256};

const SERVICE: &str = "forks-test-service-token";

fn sha(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn start(dir: &Path, http: &Client) -> (ServeProcess, PathBuf) {
    let port = free_port();
    let cfg = write_config(
        dir,
        port,
        &format!(
            "service_token = {SERVICE:?}\ntrash_retention_days = 0\nmaintenance_interval_secs = 1\nfuse.attr_ttl_ms = 0\n\n\
             [store]\nkind = \"local\"\n"
        ),
    );
    let mut d = ServeProcess::start(dir, &cfg, port, "daemon.log", &[]);
    d.wait_ready(http);
    (d, cfg)
}

fn call(http: &Client, d: &ServeProcess, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let url = format!("{}{path}", d.base);
    let mut rb = match method {
        "POST" => http.post(url),
        "PATCH" => http.patch(url),
        _ => http.get(url),
    }
    .bearer_auth(SERVICE);
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let resp = rb.send().unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().unwrap_or(Value::Null))
}

fn provision(http: &Client, d: &ServeProcess, thread: &str) -> (String, PathBuf) {
    let (_, v) = call(
        http,
        d,
        "POST",
        "/internal/workspace-scopes/provision",
        Some(json!({"operation_id": format!("op-{thread}"), "primary_thread_id": thread})),
    );
    let scope = v["scope_id"].as_str().unwrap_or_else(|| panic!("provision: {v}")).to_string();
    (scope.clone(), mount(http, d, &scope))
}

fn mount(http: &Client, d: &ServeProcess, scope: &str) -> PathBuf {
    let (status, v) = call(http, d, "GET", &format!("/internal/workspace-scopes/{scope}/mount"), None);
    assert_eq!(status, 200, "mount {scope}: {v}\n{}", d.warnings());
    PathBuf::from(v["mountpoint"].as_str().unwrap())
}

/// The bytes of file `i` of the gibibyte: ~105 KB, unique per file.
fn file_bytes(i: u32) -> Vec<u8> {
    let mut data = vec![(i % 251) as u8; 104_858];
    data[..4].copy_from_slice(&i.to_le_bytes());
    data
}

fn syncfs(dir: &Path) {
    let f = std::fs::File::open(dir).unwrap();
    // SAFETY: syncfs(2) on a descriptor this function owns.
    assert_eq!(unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)) }, 0, "syncfs");
}

/// Block objects under `scope`'s prefix in the local object directory.
fn stored_blocks(data: &Path, scope: &str) -> Vec<String> {
    let store = scopefs::store::LocalDirStore::new(data.join("objects")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let prefix = format!("scopes/{scope}/blocks/");
    rt.block_on(scopefs::store::ObjectStore::list(&store, &prefix)).unwrap().into_iter().map(|o| o.key).collect()
}

#[test]
fn a_fork_of_a_gibibyte_copies_no_block_and_outlives_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let (mut d, cfg) = start(dir.path(), &http);
    let (parent, pmnt) = provision(&http, &d, "fork-parent");

    // 1 GiB in 10,000 files of ~105 KB, 100 directories; each file's bytes unique.
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    let written = Instant::now();
    for i in 0..10_000u32 {
        let rel = format!("d{}/f{i}", i % 100);
        if i < 100 {
            std::fs::create_dir(pmnt.join(format!("d{i}"))).unwrap();
        }
        let data = file_bytes(i);
        if i % 97 == 0 {
            files.insert(rel.clone(), sha(&data));
        }
        std::fs::File::create(pmnt.join(&rel)).unwrap().write_all(&data).unwrap();
    }
    syncfs(&pmnt);
    println!("parent written: 1 GiB in 10,000 files in {:.1} s", written.elapsed().as_secs_f64());
    // Closed files' blocks are uploaded in the background; the fork starts from a settled parent.
    let deadline = Instant::now() + Duration::from_secs(300);
    let parent_blocks = loop {
        let blocks = stored_blocks(&dir.path().join("data"), &parent);
        if blocks.len() >= 10_000 {
            break blocks;
        }
        assert!(Instant::now() < deadline, "only {} blocks uploaded", blocks.len());
        std::thread::sleep(Duration::from_millis(200));
    };

    let t = Instant::now();
    let (status, fork) = call(
        &http,
        &d,
        "POST",
        &format!("/internal/workspace-scopes/{parent}/fork"),
        Some(json!({"operation_id": "op-fork-1", "primary_thread_id": "fork-child"})),
    );
    let took = t.elapsed();
    assert_eq!(status, 201, "{fork}");
    println!("fork of 1 GiB in 10,000 files: {:.0} ms", took.as_secs_f64() * 1000.0);
    let child = fork["scope_id"].as_str().unwrap().to_string();
    assert_eq!(fork["forked_from"], parent.as_str());
    assert!(stored_blocks(&dir.path().join("data"), &child).is_empty(), "a fork uploads no block");
    assert_eq!(stored_blocks(&dir.path().join("data"), &parent).len(), parent_blocks.len());
    let (again, _) = call(
        &http,
        &d,
        "POST",
        &format!("/internal/workspace-scopes/{parent}/fork"),
        Some(json!({"operation_id": "op-fork-1", "primary_thread_id": "fork-child"})),
    );
    assert_eq!(again, 200, "a fork is idempotent on its operation");

    let cmnt = mount(&http, &d, &child);
    let count: usize = (0..100).map(|k| std::fs::read_dir(cmnt.join(format!("d{k}"))).unwrap().count()).sum();
    assert_eq!(count, 10_000);
    for (rel, want) in &files {
        assert_eq!(&sha(&std::fs::read(cmnt.join(rel)).unwrap()), want, "{rel}");
    }

    // Writing in the fork never changes the parent.
    std::fs::write(cmnt.join("d1/f1"), b"the fork's own").unwrap();
    std::fs::write(cmnt.join("fork-only"), b"new").unwrap();
    std::fs::remove_file(cmnt.join("d2/f2")).unwrap();
    syncfs(&cmnt);
    assert_eq!(std::fs::read(pmnt.join("d1/f1")).unwrap().len(), 104_858);
    assert!(!pmnt.join("fork-only").exists());
    assert!(pmnt.join("d2/f2").exists());

    // Delete and purge the parent: the fork stays whole.
    let (_, rec) = call(&http, &d, "GET", "/internal/workspace-scopes/by-thread/fork-parent", None);
    let (status, v) = call(
        &http,
        &d,
        "PATCH",
        &format!("/internal/workspace-scopes/{parent}"),
        Some(json!({"expected_revision": rec["revision"], "state": "deleting"})),
    );
    assert!(status < 300, "delete: {v}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, v) = call(&http, &d, "GET", "/internal/workspace-scopes/by-thread/fork-parent", None);
        if v["purged_at"].is_i64() {
            break;
        }
        assert!(Instant::now() < deadline, "the parent was never purged: {v}\n{}", d.warnings());
        std::thread::sleep(Duration::from_millis(200));
    }
    let kept = stored_blocks(&dir.path().join("data"), &parent);
    assert!(kept.len() >= 9_999, "purge deleted blocks the fork refers to: {} left", kept.len());
    for (rel, want) in files.iter().take(20) {
        assert_eq!(&sha(&std::fs::read(cmnt.join(rel)).unwrap()), want, "{rel}");
    }

    // The fork lets go of a block it shared with the purged parent: its gc deletes it.
    let shared_gone = format!("scopes/{parent}/blocks/{}", sha(&file_bytes(3)));
    assert!(kept.contains(&shared_gone));
    std::fs::remove_file(cmnt.join("d3/f3")).unwrap();
    syncfs(&cmnt);
    d.stop(Duration::from_secs(30));
    let gc = Command::new(BIN).arg("--config").arg(&cfg).args(["gc", &child]).output().unwrap();
    assert!(gc.status.success(), "gc: {}", String::from_utf8_lossy(&gc.stderr));
    let left = stored_blocks(&dir.path().join("data"), &parent);
    assert!(!left.contains(&shared_gone), "the last holder of a purged scope's block must delete it");
    // d1/f1 (overwritten in the fork), d2/f2 and d3/f3 (removed there): nobody refers to them now.
    assert_eq!(left.len(), kept.len() - 3);
    // Every block the fork names is in the store, intact.
    let fsck = Command::new(BIN).arg("--config").arg(&cfg).args(["fsck", &child]).output().unwrap();
    assert!(
        fsck.status.success(),
        "fsck: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
}

#[test]
fn snapshots_are_listed_read_through_the_api_and_restored() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let (d, _cfg) = start(dir.path(), &http);
    let (scope, mnt) = provision(&http, &d, "snap-thread");
    std::fs::write(mnt.join("a.txt"), b"version one").unwrap();
    std::fs::write(mnt.join("b.txt"), b"kept").unwrap();
    // A program holding a file open: what its write was answered for is in the snapshot.
    let mut held = std::fs::File::create(mnt.join("held.txt")).unwrap();
    held.write_all(b"written, still open").unwrap();
    syncfs(&mnt);
    let (status, snap) = call(
        &http,
        &d,
        "POST",
        &format!("/internal/workspace-scopes/{scope}/snapshots"),
        Some(json!({"snapshot_id": "s1"})),
    );
    assert_eq!(status, 201, "{snap}");
    // Ids beginning with `out.` are the daemon's (they keep environments' outputs): a caller can
    // neither take one first nor shadow one, and nothing is recorded for the refused request.
    for taken in ["out.env-1", "out.env-1.g", "out."] {
        let (status, v) = call(
            &http,
            &d,
            "POST",
            &format!("/internal/workspace-scopes/{scope}/snapshots"),
            Some(json!({"snapshot_id": taken})),
        );
        assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_request")), "{taken}: {v}");
    }
    let (_, list) = call(&http, &d, "GET", &format!("/internal/workspace-scopes/{scope}/snapshots"), None);
    assert_eq!(list["snapshots"].as_array().map(Vec::len), Some(1), "only s1: {list}");
    std::fs::write(mnt.join("a.txt"), b"version two").unwrap();
    std::fs::write(mnt.join("c.txt"), b"after the snapshot").unwrap();
    syncfs(&mnt);
    let (_, list) = call(&http, &d, "GET", &format!("/internal/workspace-scopes/{scope}/snapshots"), None);
    assert_eq!(list["snapshots"][0]["snapshot_id"], "s1");

    // Read through the file API: the snapshot's version, and its listing.
    let read = |snapshot: Option<&str>| {
        let mut url = format!("{}/api/workspace/file?threadId=snap-thread&path=/a.txt", d.base);
        if let Some(s) = snapshot {
            url.push_str(&format!("&snapshotId={s}"));
        }
        http.get(url).bearer_auth(SERVICE).send().unwrap().bytes().unwrap().to_vec()
    };
    assert_eq!(read(Some("s1")), b"version one");
    assert_eq!(read(None), b"version two");
    held.write_all(b"; more after the snapshot").unwrap();
    drop(held);
    let held_in = |snapshot: &str| {
        let url = format!("{}/api/workspace/file?threadId=snap-thread&path=/held.txt&snapshotId={snapshot}", d.base);
        http.get(url).bearer_auth(SERVICE).send().unwrap().bytes().unwrap().to_vec()
    };
    assert_eq!(held_in("s1"), b"written, still open", "a snapshot lacks a write to a file held open");
    assert_eq!(std::fs::read(mnt.join("held.txt")).unwrap(), b"written, still open; more after the snapshot");
    let listing: Value = http
        .get(format!("{}/api/workspace?threadId=snap-thread&snapshotId=s1", d.base))
        .bearer_auth(SERVICE)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let names: Vec<&str> = listing["entries"].as_array().unwrap().iter().filter_map(|e| e["name"].as_str()).collect();
    assert!(names.contains(&"a.txt") && !names.contains(&"c.txt"), "{listing}");
    let write = http
        .put(format!("{}/api/workspace/file?threadId=snap-thread&path=/x&snapshotId=s1", d.base))
        .bearer_auth(SERVICE)
        .body("no")
        .send()
        .unwrap();
    assert_eq!(write.status(), 400, "a snapshot is read-only");

    // Restored into its scope: the files are the snapshot's again, through the mount.
    let (status, v) =
        call(&http, &d, "POST", &format!("/internal/workspace-scopes/{scope}/snapshots/s1/restore"), None);
    assert_eq!(status, 200, "{v}\n{}", d.warnings());
    let mnt = mount(&http, &d, &scope);
    assert_eq!(std::fs::read(mnt.join("a.txt")).unwrap(), b"version one");
    assert_eq!(std::fs::read(mnt.join("b.txt")).unwrap(), b"kept");
    assert!(!mnt.join("c.txt").exists());
    // The snapshot itself is unchanged, and never mounted.
    assert_eq!(read(Some("s1")), b"version one");
    let snap_scope = snap["snapshot_scope_id"].as_str().unwrap();
    assert!(mounts_under(&d.mount_root).iter().all(|m| !m.contains(snap_scope)));
}
