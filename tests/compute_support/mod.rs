//! Shared by the Docker-backed compute tests (contract, tools, shared compute, peer mounts): the
//! sandbox image, unique ids, the configuration of a daemon that runs environments, provisioning a
//! scope, admin requests and signed tool calls.

use std::process::Command;

pub mod daemon;

/// The sandbox image the tests run (`SCOPEFS_TEST_DOCKER_IMAGE`, set by scripts/docker.sh); a
/// missing variable, engine or image fails the test with the step that provides it.
pub fn docker_image() -> String {
    image_named_by("SCOPEFS_TEST_DOCKER_IMAGE")
}

/// The sandbox image with python (`SCOPEFS_TEST_PYTHON_IMAGE`, set by scripts/docker.sh), for
/// the seed's gateway smoke test; missing, it fails the test with the step that provides it.
pub fn python_image() -> String {
    image_named_by("SCOPEFS_TEST_PYTHON_IMAGE")
}

/// The local image the variable `var` names, checked to exist.
fn image_named_by(var: &str) -> String {
    let image = std::env::var(var).unwrap_or_default();
    assert!(!image.is_empty(), "{var} is not set: run scripts/test.sh (or `eval \"$(bash scripts/docker.sh)\"`)");
    let ok = Command::new("docker").args(["image", "inspect", &image]).output().expect("docker CLI missing");
    assert!(ok.status.success(), "Docker engine not answering or image {image} missing (run scripts/docker.sh)");
    image
}

/// A unique id (UUIDv7, hex).
pub fn uid() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// The secrets of a test daemon.
pub struct Secrets<'a> {
    pub service_token: &'a str,
    pub hmac_secret: &'a str,
    pub admin_token: Option<&'a str>,
}

/// The configuration (after `serve_process::write_config`'s base) of a daemon of `deployment` with
/// the local store and the Docker executor on `image`; `extra` is appended (limits, pricing).
pub fn compute_toml(deployment: &str, secrets: &Secrets<'_>, image: &str, extra: &str) -> String {
    let Secrets { service_token, hmac_secret, admin_token } = secrets;
    let admin = admin_token.map(|t| format!("admin_token = {t:?}\n")).unwrap_or_default();
    format!(
        "deployment_id = {deployment:?}\nservice_token = {service_token:?}\nhmac_secret = {hmac_secret:?}\n{admin}\n\
         [store]\nkind = \"local\"\n\n[executor]\nimage = {image:?}\nmax_runtime_secs = 600\n\
         command_timeout_secs = 30\n\n{extra}"
    )
}

/// Provisions the draft scope of `thread` (for `user` when given) on the daemon at `base`, checks
/// that the answer names the user it was given (none when none), and returns the scope id.
pub fn provision(
    client: &reqwest::blocking::Client,
    base: &str,
    service_token: &str,
    thread: &str,
    user: Option<&str>,
) -> String {
    use serde_json::json;
    let mut body = json!({"operation_id": format!("op-{thread}"), "primary_thread_id": thread});
    if let Some(u) = user {
        body["user_id"] = json!(u);
    }
    let url = format!("{base}/internal/workspace-scopes/provision");
    let resp = client.post(url).bearer_auth(service_token).json(&body).send().expect("provision request");
    assert!(resp.status().is_success(), "provision {thread}: {}", resp.status());
    let v: serde_json::Value = resp.json().unwrap();
    assert_eq!(v["user_id"].as_str(), user, "{v}");
    v["scope_id"].as_str().expect("scope_id").to_string()
}

/// An `/admin` request (`X-Admin-Token`) to the daemon at `base`, with a JSON body when given;
/// it must succeed; its JSON answer.
pub fn admin_call(
    client: &reqwest::blocking::Client,
    (base, admin_token): (&str, &str),
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> serde_json::Value {
    let mut req = client.request(method, format!("{base}{path}")).header("X-Admin-Token", admin_token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().expect("admin request");
    let status = resp.status();
    let v: serde_json::Value = resp.json().expect("admin JSON");
    assert!(status.is_success(), "{path}: {status} {v}");
    v
}

/// A signed `/tools/<tool>` call (seed 003 §4.3) to the daemon at `base`, as `thread` of `user`,
/// with `object_scope` in its `auth_context` when given; the status and the JSON answer.
pub fn signed_call(
    client: &reqwest::blocking::Client,
    base: &str,
    hmac_secret: &str,
    (user, thread): (&str, &str),
    tool: &str,
    params: serde_json::Value,
    object_scope: Option<serde_json::Value>,
) -> (reqwest::StatusCode, serde_json::Value) {
    let (path, body) = signed_body(hmac_secret, (user, thread), tool, params, object_scope);
    let resp = client.post(format!("{base}{path}")).json(&body).send().expect("request failed");
    let status = resp.status();
    let text = resp.text().unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("non-JSON answer ({e}): {text}")))
}

/// The route and signed body of a `/tools/<tool>` call (see [`signed_call`]).
pub fn signed_body(
    hmac_secret: &str,
    (user, thread): (&str, &str),
    tool: &str,
    params: serde_json::Value,
    object_scope: Option<serde_json::Value>,
) -> (String, serde_json::Value) {
    use serde_json::json;
    let path = format!("/tools/{tool}");
    let issued_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let nonce = uid();
    let mut body = params;
    body["auth_context"] = json!({"user_id": user, "thread_id": thread, "issued_at": issued_at, "nonce": nonce});
    if let Some(s) = object_scope {
        body["auth_context"]["object_scope"] = s;
    }
    let canonical = scopefs::signing::parse(&serde_json::to_vec(&body).unwrap()).unwrap().to_canonical();
    let hash = scopefs::signing::payload_hash(&canonical);
    let string = scopefs::signing::canonical_string("POST", &path, &issued_at.to_string(), &nonce, &hash);
    body["auth_context"]["token"] = json!(scopefs::signing::sign(hmac_secret.as_bytes(), &string));
    (path, body)
}
