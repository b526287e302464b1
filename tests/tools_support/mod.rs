//! Signed `/tools/*` calls for the tool tests: a daemon with a known HMAC secret, bodies signed as
//! seed 003 §4.3 describes (through `scopefs::signing`), and raw posts.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::workspace_support::{Answer, Daemon};

/// The HMAC secret of the test daemons.
pub const SECRET: &str = "tools-test-hmac-secret-0123456789abcdef";

pub fn now_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A nonce never used before in this process.
pub fn fresh_nonce() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{t:x}{:x}{n:x}", std::process::id())
}

/// The body of a call of `path` by `thread`, signed with `secret` at `issued_at` with `nonce`.
pub fn signed_body_with(secret: &str, path: &str, thread: &str, params: &Value, issued_at: i64, nonce: &str) -> String {
    let mut body = params.clone();
    body["auth_context"] = json!({"user_id": "user-1", "thread_id": thread, "issued_at": issued_at, "nonce": nonce});
    let canonical = scopefs::signing::parse(&serde_json::to_vec(&body).unwrap()).unwrap().to_canonical();
    let digest = scopefs::signing::payload_hash(&canonical);
    let string = scopefs::signing::canonical_string("POST", path, &issued_at.to_string(), nonce, &digest);
    body["auth_context"]["token"] = Value::String(scopefs::signing::sign(secret.as_bytes(), &string));
    serde_json::to_string(&body).unwrap()
}

pub fn signed_body(path: &str, thread: &str, params: &Value, issued_at: i64, nonce: &str) -> String {
    signed_body_with(SECRET, path, thread, params, issued_at, nonce)
}

/// A daemon whose `/tools` secret is [`SECRET`] (plus `env`).
pub fn start_daemon(env: &[(&str, &str)]) -> Daemon {
    let mut all = vec![("SCOPEFS_HMAC_SECRET", SECRET)];
    all.extend_from_slice(env);
    Daemon::start_with_env(&all)
}

/// Posts a raw body to `path`.
pub fn post_raw(d: &Daemon, path: &str, body: String) -> Answer {
    d.send(d.client.post(d.url(path)).header("content-type", "application/json").body(body))
}

/// Calls tool `name` (e.g. `read_file`) as `thread`, signed now with a fresh nonce.
pub fn call(d: &Daemon, name: &str, thread: &str, params: Value) -> Answer {
    let path = format!("/tools/{name}");
    post_raw(d, &path, signed_body(&path, thread, &params, now_secs(), &fresh_nonce()))
}

/// The peak resident memory (`VmHWM`) of process `pid`, in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading /proc/<pid>/status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/<pid>/status");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmHWM is a number of kB")
}
