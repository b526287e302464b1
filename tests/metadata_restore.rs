//! Issue 23 acceptance a: disk loss. A daemon on Garage with every scope's metadata and the
//! registry shipped to the bucket; files written through the mounts and fsynced; `kill -9`; the
//! whole data directory deleted. Restored by `scopefs restore --all` and by a daemon that finds no
//! local copy (on its own, at startup and at a scope's first open): every file back with the same
//! SHA-256, the registry's scopes and owners back, the billing ledger back.
//!
//! Needs root, /dev/fuse and the `SCOPEFS_TEST_S3_*` environment of `scripts/test.sh` (Garage); a
//! missing prerequisite fails the test.

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

const SERVICE: &str = "restore-test-service-token";
const ADMIN: &str = "restore-test-admin-token";

fn env(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!("{name} is not set: this test needs Garage; run it through scripts/test.sh"),
    }
}

/// A daemon config on Garage under a prefix of its own, tokens fixed in the file (a lost disk
/// must not change them), metadata shipped every 200 ms.
fn config(dir: &Path, port: u16, prefix: &str) -> PathBuf {
    write_config(
        dir,
        port,
        &format!(
            "service_token = {SERVICE:?}\nadmin_token = {ADMIN:?}\nmetadata_sync_interval_ms = 200\nfuse.attr_ttl_ms = 0\n\n\
             [store]\nkind = \"s3\"\nendpoint = {e:?}\nregion = {r:?}\nbucket = {b:?}\nprefix = {prefix:?}\n\
             access_key_id = {k:?}\nsecret_access_key = {s:?}\n",
            e = env("SCOPEFS_TEST_S3_ENDPOINT"),
            r = env("SCOPEFS_TEST_S3_REGION"),
            b = env("SCOPEFS_TEST_S3_BUCKET"),
            k = env("SCOPEFS_TEST_S3_ACCESS_KEY_ID"),
            s = env("SCOPEFS_TEST_S3_SECRET_ACCESS_KEY"),
        ),
    )
}

fn start(dir: &Path, cfg: &Path, port: u16, log: &str, http: &Client) -> ServeProcess {
    let mut daemon = ServeProcess::start(dir, cfg, port, log, &[]);
    daemon.wait_ready(http);
    daemon
}

/// Provisions thread `thread`'s scope; its id.
fn provision(http: &Client, d: &ServeProcess, thread: &str) -> String {
    let resp: Value = http
        .post(format!("{}/internal/workspace-scopes/provision", d.base))
        .bearer_auth(SERVICE)
        .json(&json!({"operation_id": format!("op-{thread}"), "primary_thread_id": thread, "user_id": "user-1"}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    resp["scope_id"].as_str().unwrap_or_else(|| panic!("provision answered {resp}")).to_owned()
}

/// Mounts a scope; its mount point (the scope is opened, so restored if it must be, first).
fn mount(http: &Client, d: &ServeProcess, scope: &str) -> PathBuf {
    let resp =
        http.get(format!("{}/internal/workspace-scopes/{scope}/mount", d.base)).bearer_auth(SERVICE).send().unwrap();
    let status = resp.status();
    let body: Value = resp.json().unwrap();
    let path =
        body["mountpoint"].as_str().unwrap_or_else(|| panic!("mount answered {status} {body}: {}", d.warnings()));
    PathBuf::from(path)
}

fn metric(http: &Client, d: &ServeProcess, name: &str) -> u64 {
    let text = http.get(format!("{}/metrics", d.base)).bearer_auth(SERVICE).send().unwrap().text().unwrap();
    let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in /metrics"));
    line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
}

/// Waits (within 30 s) until the registry's newest change is in the bucket.
fn registry_shipped(http: &Client, d: &ServeProcess) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(http, d, "scopefs_registry_unshipped_changes") != 0 {
        assert!(Instant::now() < deadline, "the registry was never shipped: {}", d.warnings());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes `files` files of 100 B to 200 KiB under `mnt`, each fsynced; their SHA-256 by name.
fn write_files(mnt: &Path, files: usize, seed: u64) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    std::fs::create_dir_all(mnt.join("work/sub")).unwrap();
    for i in 0..files {
        let len = 100 + (i * 7919 + seed as usize * 104_729) % (200 * 1024);
        let data: Vec<u8> = (0..len).map(|j| (j as u64 * 31 + seed * 17 + i as u64) as u8).collect();
        let name = if i % 3 == 0 { format!("work/sub/f{i}") } else { format!("work/f{i}") };
        let mut f = std::fs::File::create(mnt.join(&name)).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        out.insert(name, hex::encode(Sha256::digest(&data)));
    }
    out
}

fn check_files(mnt: &Path, expect: &BTreeMap<String, String>) {
    for (name, sha) in expect {
        let data = std::fs::read(mnt.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&hex::encode(Sha256::digest(&data)), sha, "{name}");
    }
}

fn credit(http: &Client, d: &ServeProcess) {
    let resp = http
        .post(format!("{}/admin/accounts/user-1/credit", d.base))
        .header("X-Admin-Token", ADMIN)
        .json(&json!({"amount": "5.000000", "idempotency_key": "restore-test-credit", "note": "before the disk loss"}))
        .send()
        .unwrap();
    assert!(resp.status().is_success(), "credit answered {}", resp.status());
}

fn ledger(http: &Client, d: &ServeProcess) -> Value {
    let resp =
        http.get(format!("{}/admin/accounts/user-1/ledger", d.base)).header("X-Admin-Token", ADMIN).send().unwrap();
    assert!(resp.status().is_success(), "ledger answered {}", resp.status());
    resp.json().unwrap()
}

/// Registers (or finds) the owner of resource `child-of-<scope>` in `scope`: 201 when it is new,
/// 200 when the registry already holds it.
fn owner(http: &Client, d: &ServeProcess, scope: &str) -> (u16, Value) {
    let resp = http
        .post(format!("{}/internal/workspace-scopes/{scope}/owners", d.base))
        .bearer_auth(SERVICE)
        .json(&json!({"owner_type": "async_thread", "resource_id": format!("child-of-{scope}")}))
        .send()
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().unwrap())
}

/// What the registry answers of the scopes of `threads` (each record, without timestamps: a
/// mount after the restore may move them).
fn registry_view(http: &Client, d: &ServeProcess, threads: usize) -> Value {
    fn untimed(v: Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.into_iter()
                    .filter(|(k, _)| !k.ends_with("_at") && !k.ends_with("_ms"))
                    .map(|(k, v)| (k, untimed(v)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.into_iter().map(untimed).collect()),
            other => other,
        }
    }
    let view: Vec<Value> = (0..threads)
        .map(|t| {
            let path = format!("/internal/workspace-scopes/by-thread/thread-{t}");
            let resp = http.get(format!("{}{path}", d.base)).bearer_auth(SERVICE).send().unwrap();
            assert!(resp.status().is_success(), "{path} answered {}", resp.status());
            untimed(resp.json().unwrap())
        })
        .collect();
    Value::Array(view)
}

/// Everything written, then the disk lost: what the test checks after each way back.
struct Before {
    files: BTreeMap<String, BTreeMap<String, String>>,
    registry: Value,
    ledger: Value,
}

/// Writes `scopes` scopes of `files` files each, credits an account, waits for the registry to be
/// shipped, kills the daemon with SIGKILL and deletes the data directory.
fn write_then_lose_the_disk(dir: &Path, cfg: &Path, port: u16, scopes: usize, files: usize) -> Before {
    let http = client();
    let mut d = start(dir, cfg, port, "before.log", &http);
    let mut written = BTreeMap::new();
    for s in 0..scopes {
        let scope = provision(&http, &d, &format!("thread-{s}"));
        let mnt = mount(&http, &d, &scope);
        written.insert(scope.clone(), write_files(&mnt, files, s as u64));
        assert_eq!(owner(&http, &d, &scope).0, 201);
    }
    credit(&http, &d);
    assert_eq!(written.len(), scopes);
    let before = Before { registry: registry_view(&http, &d, scopes), files: written, ledger: ledger(&http, &d) };
    registry_shipped(&http, &d);
    d.kill9();
    detach_mounts_under(&d.mount_root);
    std::fs::remove_dir_all(dir.join("data")).unwrap();
    before
}

fn check_after(http: &Client, d: &ServeProcess, before: &Before) {
    assert_eq!(registry_view(http, d, before.files.len()), before.registry, "the registry's scopes");
    for scope in before.files.keys() {
        let (status, body) = owner(http, d, scope);
        assert_eq!(status, 200, "the owner registered before the loss is known: {body}");
    }
    assert_eq!(ledger(http, d), before.ledger, "the billing ledger");
    for (scope, files) in &before.files {
        check_files(&mount(http, d, scope), files);
    }
}

#[test]
fn a_lost_data_directory_is_rebuilt_by_restore_all() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let prefix = format!("restore-all-{}/", uuid::Uuid::now_v7());
    let cfg = config(tmp.path(), port, &prefix);
    let before = write_then_lose_the_disk(tmp.path(), &cfg, port, 20, 50);
    let total: usize = before.files.values().map(BTreeMap::len).sum();
    assert_eq!(total, 1000);
    let out = Command::new(BIN).arg("--config").arg(&cfg).args(["restore", "--all"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "restore failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("registry: restored from the object store"), "{text}");
    assert!(text.contains("restored 20 of 20 scopes"), "{text}");
    assert!(!text.contains("blocks missing)") || text.contains(" 0 blocks missing)"), "{text}");
    let http = client();
    let d = start(tmp.path(), &cfg, port, "after.log", &http);
    check_after(&http, &d, &before);
}

#[test]
fn a_daemon_without_a_local_copy_restores_the_registry_and_each_scope_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let prefix = format!("restore-self-{}/", uuid::Uuid::now_v7());
    let cfg = config(tmp.path(), port, &prefix);
    let before = write_then_lose_the_disk(tmp.path(), &cfg, port, 4, 25);
    let http = client();
    let d = start(tmp.path(), &cfg, port, "after.log", &http);
    check_after(&http, &d, &before);
}
