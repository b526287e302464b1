//! Signed `/tools/*` bodies for integration tests: fresh nonces and bodies signed as seed 003 §4.3
//! describes, through `scopefs::signing` (shared by `tools_support` and `hostile_support`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

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

/// The body of a call of `path` by `thread` (user `user-1`), signed with `secret` at `issued_at`
/// with `nonce`.
pub fn signed_body_with(secret: &str, path: &str, thread: &str, params: &Value, issued_at: i64, nonce: &str) -> String {
    signed_body_as(secret, path, "user-1", thread, params, issued_at, nonce)
}

/// [`signed_body_with`] for `user`.
pub fn signed_body_as(
    secret: &str,
    path: &str,
    user: &str,
    thread: &str,
    params: &Value,
    issued_at: i64,
    nonce: &str,
) -> String {
    let mut body = params.clone();
    body["auth_context"] = json!({"user_id": user, "thread_id": thread, "issued_at": issued_at, "nonce": nonce});
    let canonical = scopefs::signing::parse(&serde_json::to_vec(&body).unwrap()).unwrap().to_canonical();
    let digest = scopefs::signing::payload_hash(&canonical);
    let string = scopefs::signing::canonical_string("POST", path, &issued_at.to_string(), nonce, &digest);
    body["auth_context"]["token"] = Value::String(scopefs::signing::sign(secret.as_bytes(), &string));
    serde_json::to_string(&body).unwrap()
}
