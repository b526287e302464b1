//! Signed `/tools/*` calls for the tool tests: a daemon with a known HMAC secret, bodies signed as
//! seed 003 §4.3 describes (through `scopefs::signing`), and raw posts.

use serde_json::{json, Value};

use crate::workspace_support::{Answer, Daemon};

/// The HMAC secret of the test daemons.
pub const SECRET: &str = "tools-test-hmac-secret-0123456789abcdef";

#[path = "../signing_support/mod.rs"]
pub mod signing_support;
pub use signing_support::{fresh_nonce, now_secs, signed_body_with};

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

/// A body signed for `path` as `thread`, with `object_scope` in its `auth_context` when given
/// (seed 003 §4.3 `build_auth_context`).
pub fn signed_with_scope(path: &str, thread: &str, params: &Value, object_scope: Option<&Value>) -> String {
    let issued_at = now_secs();
    let nonce = fresh_nonce();
    let mut body = params.clone();
    let mut ctx = json!({"user_id": "user-1", "thread_id": thread, "issued_at": issued_at, "nonce": nonce});
    if let Some(scope) = object_scope {
        ctx["object_scope"] = scope.clone();
    }
    body["auth_context"] = ctx;
    let canonical = scopefs::signing::parse(&serde_json::to_vec(&body).unwrap()).unwrap().to_canonical();
    let digest = scopefs::signing::payload_hash(&canonical);
    let string = scopefs::signing::canonical_string("POST", path, &issued_at.to_string(), &nonce, &digest);
    body["auth_context"]["token"] = Value::String(scopefs::signing::sign(SECRET.as_bytes(), &string));
    serde_json::to_string(&body).unwrap()
}

/// Calls tool `name` as `thread` under `object_scope`.
pub fn call_scoped(d: &Daemon, name: &str, thread: &str, params: Value, object_scope: &Value) -> Answer {
    let path = format!("/tools/{name}");
    post_raw(d, &path, signed_with_scope(&path, thread, &params, Some(object_scope)))
}
