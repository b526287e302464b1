//! The malformed-request fuzz: request `i` of seed `s` is a pure function of `(s, i)` (reproducible
//! whatever the thread order), built over every route of the daemon's route table: wrong JSON types,
//! huge numbers, bad UTF-8, path traversal in every encoding, oversized bodies, missing and forged
//! authentication, replayed nonces, broken framing. Sent over raw TCP to 127.0.0.1 only.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::{
    fresh_nonce, now_secs, raw_request, signed_body_with, Outcome, Rng, ADMIN_TOKEN, MAX_UPLOAD, SERVICE_TOKEN,
};

/// One row of the route table (`/openapi.json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub method: String,
    pub path: String,
    /// `public`, `service_token`, `admin_token` or `hmac_auth_context`.
    pub auth: String,
}

/// What the fuzz aims at: one scope, its primary thread and the signing secret.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub scope_id: String,
    pub thread: String,
    pub secret: String,
    /// Whether the fuzz may take the deployment's blocking leases (`workspace-cutover`,
    /// `maintenance`); off while a bystander must keep working.
    pub blocking_leases: bool,
}

/// 5xx answers a correct daemon may give, by `(status, error code)`: `503 compute_unavailable`
/// because the daemon runs without a sandbox executor (`docker_host` is a missing socket), and
/// `503 cutover-in-progress` when the fuzz itself took a blocking lease (`workspace-cutover`,
/// `maintenance`), as the provision route documents. Every other 5xx is a failure.
pub const ALLOWED_5XX: &[(u16, &str)] = &[(503, "compute_unavailable"), (503, "cutover-in-progress")];

/// Strings that try to leave a scope or confuse a decoder, in every encoding.
pub const TRAVERSAL: &[&str] = &[
    "../etc/passwd",
    "../../../../../../etc/shadow",
    "a/../../b",
    "notes/../../..",
    "..",
    ".",
    "./.",
    "%2e%2e/%2e%2e/etc/passwd",
    "%2E%2E%2F%2E%2E%2Fetc",
    "%252e%252e%252fetc%252fpasswd",
    "%25252e%25252e/x",
    "..\\..\\windows\\win.ini",
    "..%5c..%5cboot.ini",
    "%c0%ae%c0%ae/%c0%ae%c0%ae/etc",
    "%c0%af..%c0%afetc",
    "%e0%80%ae%e0%80%ae/",
    "%ef%bc%8e%ef%bc%8e/x",
    "/etc/passwd",
    "/workspace/../etc/passwd",
    "/workspace/../../root",
    "//etc//passwd",
    "C:\\Windows\\system32",
    "\\\\server\\share",
    "a\u{0}b",
    "%00",
    "x%00.txt",
    "..%00/",
    "....//....//etc",
    "..;/x",
    "%2f..%2f..%2f",
    "~root/.ssh",
    "\u{202e}txt.exe",
    "\u{feff}a",
    "K\u{212a}ey.txt",
    "a/./b/./c",
    "",
    " ",
    "\t\n",
    "*",
    "**/**/**/**",
    "[a-",
    "notes.txt",
    "/workspace/notes.txt",
    "dir/sub/file.txt",
];

/// Numbers as raw JSON text: out of every integer type, non-finite as text, negative zero, exponents.
const HUGE_NUMBERS: &[&str] = &[
    "18446744073709551616",
    "-9223372036854775809",
    "99999999999999999999999999999999999999",
    "1e999999",
    "-1e999999",
    "1e-999999",
    "-0",
    "0.0000000000000000000000000001",
    "4294967296",
    "-1",
    "1.5",
    "9007199254740993",
];

/// Every body field any route reads (internal, workspace, admin, tools).
const FIELDS: &[&str] = &[
    "operation_id",
    "primary_thread_id",
    "expected_revision",
    "state",
    "owner_type",
    "resource_id",
    "parent_owner_id",
    "run_request_id",
    "turn_id",
    "interrupt_key",
    "request_hash",
    "run_id",
    "ttl_seconds",
    "limit",
    "usage_ids",
    "amount",
    "idempotency_key",
    "note",
    "plan",
    "source_path",
    "target_path",
    "path",
    "content",
    "old_string",
    "new_string",
    "replace_all",
    "pattern",
    "glob",
    "remote_path",
    "content_base64",
    "sha256",
    "environment_id",
    "command",
    "timeout_seconds",
    "max_output_bytes",
    "process_id",
    "tail_bytes",
    "max_runtime_seconds",
];

const QUERY_KEYS: &[&str] =
    &["threadId", "path", "dir", "recursive", "download", "overwrite", "operation_id", "owner_type", "limit", "before"];

/// One request on the wire, and a short description for a failure report.
pub struct Wire {
    pub head: Vec<u8>,
    pub body: Vec<u8>,
    pub route: usize,
    pub label: String,
}

/// A JSON value of the wrong type, out of range, hostile or plausible.
fn junk_value(r: &mut Rng, depth: u32) -> Value {
    match r.below(14) {
        0 => Value::Null,
        1 => Value::Bool(r.chance(500)),
        2 => json!(u64::MAX),
        3 => json!(i64::MIN),
        4 => json!(1e308),
        5 => json!(-1),
        6 if depth < 3 => Value::Array((0..r.below(4)).map(|_| junk_value(r, depth + 1)).collect()),
        7 if depth < 3 => {
            let mut m = Map::new();
            for _ in 0..r.below(4) {
                m.insert(r.pick(FIELDS).to_string(), junk_value(r, depth + 1));
            }
            Value::Object(m)
        }
        8 => Value::String("x".repeat(1 + r.below(70_000))),
        9 => Value::String("é\u{10ffff}\u{fffd}".repeat(1 + r.below(50))),
        10 => json!(r.below(3)),
        _ => Value::String(r.pick(TRAVERSAL).to_string()),
    }
}

/// A body for a JSON route: an object of known fields with hostile values.
fn junk_params(r: &mut Rng) -> Map<String, Value> {
    let mut m = Map::new();
    for _ in 0..r.below(6) {
        m.insert(r.pick(FIELDS).to_string(), junk_value(r, 0));
    }
    m
}

/// The fields of a route's JSON body and their types (`s` string, `n` number, `b` bool, `l` list
/// of strings), so that most fuzzed bodies deserialize and reach the handler's own checks.
fn template(path: &str) -> &'static [(&'static str, char)] {
    let tail = path.rsplit('/').next().unwrap_or("");
    match (path.split('/').nth(1).unwrap_or(""), tail) {
        ("tools", "read_file" | "list_dir") => &[("path", 's')],
        ("tools", "write_file") => &[("path", 's'), ("content", 's')],
        ("tools", "edit_file") => &[("path", 's'), ("old_string", 's'), ("new_string", 's'), ("replace_all", 'b')],
        ("tools", "grep_files") => &[("pattern", 's'), ("path", 's'), ("glob", 's')],
        ("tools", "glob_files") => &[("pattern", 's'), ("path", 's')],
        ("tools", "upload_file") => &[("remote_path", 's'), ("content_base64", 's'), ("sha256", 's')],
        ("tools", "download_file") => &[("remote_path", 's')],
        ("tools", "create_environment") => &[("max_runtime_seconds", 'n')],
        ("tools", "execute_command") => {
            &[("environment_id", 's'), ("command", 's'), ("timeout_seconds", 'n'), ("max_output_bytes", 'n')]
        }
        ("tools", "start_process") => &[("command", 's'), ("environment_id", 's')],
        ("tools", "check_process") => &[("process_id", 's'), ("tail_bytes", 'n')],
        ("tools", "stop_process") => &[("process_id", 's')],
        ("tools", _) => &[("environment_id", 's')],
        ("internal", "provision") => &[("operation_id", 's'), ("primary_thread_id", 's')],
        ("internal", "owners") => &[("owner_type", 's'), ("resource_id", 's'), ("parent_owner_id", 's')],
        ("internal", "reserve") => {
            &[("run_request_id", 's'), ("turn_id", 's'), ("interrupt_key", 's'), ("request_hash", 's')]
        }
        ("internal", "{owner_id}") => &[("expected_revision", 'n'), ("resource_id", 's'), ("state", 's')],
        ("internal", "{run_request_id}") => &[("run_id", 's'), ("state", 's')],
        ("internal", "{lock_name}") => &[("operation_id", 's'), ("ttl_seconds", 'n')],
        ("internal", _) => &[("expected_revision", 'n'), ("state", 's')],
        ("api", "import") => &[("source_path", 's'), ("target_path", 's'), ("idempotency_key", 's')],
        ("admin", "pending-usage") => &[("limit", 'n')],
        ("admin", "mark-settled" | "mark-artifacts-registered") => &[("usage_ids", 'l')],
        ("admin", "credit") => &[("amount", 's'), ("idempotency_key", 's'), ("note", 's')],
        ("admin", "plan") => &[("plan", 's')],
        _ => &[],
    }
}

/// A string of the right type with a hostile or plausible value.
fn typed_string(r: &mut Rng) -> String {
    match r.below(8) {
        0 => r
            .pick(&["active", "deleting", "deleted", "draft", "async_thread", "memory_worker", "cron", "started"])
            .to_string(),
        1 => r
            .pick(&["pro", "free", "10.000000", "-1", "1e9", "0.0000001", "NaN", "99999999999999999999.999999"])
            .to_string(),
        2 => "x".repeat(1 + r.below(20_000)),
        3 => "0".repeat(64),
        _ => r.pick(TRAVERSAL).to_string(),
    }
}

/// A number of the right type: never a small value such as a live scope revision (so the fuzz
/// does not delete the scope it aims at), often out of range.
fn typed_number(r: &mut Rng) -> Value {
    match r.below(7) {
        0 => json!(0),
        1 => json!(u64::MAX),
        2 => json!(i64::MAX),
        3 => json!(1_000_000_000_000u64),
        4 => json!(4_294_967_296u64),
        5 => json!(-1),
        _ => json!(1.5),
    }
}

/// A body for `path`: usually its own fields with values of the right type, sometimes any field
/// with a value of any type.
fn params_for(r: &mut Rng, path: &str) -> Map<String, Value> {
    let fields = template(path);
    if fields.is_empty() || r.chance(300) {
        return junk_params(r);
    }
    let mut m = Map::new();
    for (name, kind) in fields {
        if r.chance(150) {
            continue;
        }
        let v = match kind {
            's' => Value::String(typed_string(r)),
            'n' => typed_number(r),
            'b' => Value::Bool(r.chance(500)),
            _ => Value::Array((0..r.below(600)).map(|_| Value::String(typed_string(r))).collect()),
        };
        m.insert(name.to_string(), v);
    }
    m
}

/// A body that is not valid JSON, or valid JSON no route expects.
fn raw_junk_body(r: &mut Rng) -> Vec<u8> {
    match r.below(12) {
        0 => vec![0xff, 0xfe, 0x00, 0xc0, 0xae, b'{', 0x80],
        1 => b"{\"path\": \"a\xff\xfe\", \"content\": \"\xc0\xae\"}".to_vec(),
        2 => b"{\"path\": ".to_vec(),
        3 => format!("{{\"limit\": {0}, \"ttl_seconds\": {0}, \"expected_revision\": {0}}}", r.pick(HUGE_NUMBERS))
            .into_bytes(),
        4 => format!("{}{}", "[".repeat(1 + r.below(20_000)), "]".repeat(r.below(3))).into_bytes(),
        5 => format!("[{}0]", "0,".repeat(r.below(200_000))).into_bytes(),
        6 => b"{\"a\":1,\"a\":2,\"auth_context\":null,\"auth_context\":{}}".to_vec(),
        7 => b"\xef\xbb\xbf{}".to_vec(),
        8 => b"null".to_vec(),
        9 => format!("\"{}\"", "\\u0000".repeat(r.below(1000))).into_bytes(),
        10 => b"{\"s\":\"\\ud800\"}".to_vec(),
        _ => Vec::new(),
    }
}

/// A path-parameter value.
fn param_value(r: &mut Rng, name: &str, t: &Target) -> String {
    if r.chance(450) {
        return match name {
            "scope_id" => t.scope_id.clone(),
            "thread_id" => t.thread.clone(),
            "user_id" => "user-1".into(),
            "lock_name" if t.blocking_leases => r.pick(&["workspace-cutover", "maintenance", "fuzz-lock"]).to_string(),
            "lock_name" => "fuzz-lock".into(),
            _ => format!("{name}-{}", r.below(5)),
        };
    }
    match r.below(5) {
        0 => r.pick(HUGE_NUMBERS).to_string(),
        1 => "0190b6d5-6f1e-7c3a-8f00-000000000000".into(),
        2 => "A".repeat(1 + r.below(9000)),
        _ => r.pick(TRAVERSAL).to_string(),
    }
}

/// `value` as it goes into a request target: raw (spaces, NUL, non-ASCII and all), or
/// percent-encoded, or double-encoded.
fn in_target(r: &mut Rng, value: &str) -> Vec<u8> {
    match r.below(4) {
        0 => value.as_bytes().to_vec(),
        1 => {
            let mut out = value.as_bytes().to_vec();
            if r.chance(300) {
                out.extend_from_slice(&[0xff, 0xc0, 0xae]);
            }
            out
        }
        2 => percent(value.as_bytes(), false).into_bytes(),
        _ => percent(percent(value.as_bytes(), false).as_bytes(), true).into_bytes(),
    }
}

fn percent(bytes: &[u8], all: bool) -> String {
    let mut s = String::new();
    for &b in bytes {
        if !all && (b.is_ascii_alphanumeric() || b"-_.~".contains(&b)) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// Request `index` of a run seeded with `seed` (one or two wires: a replay sends a valid signed
/// request, then the very same bytes again).
pub fn generate(seed: u64, index: u64, routes: &[Route], t: &Target) -> Vec<Wire> {
    let mut r = Rng::for_index(seed, index);
    let ri = r.below(routes.len());
    let route = &routes[ri];
    let method = if r.chance(80) {
        r.pick(&["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "BREW", "G\u{e9}T"]).to_string()
    } else {
        route.method.clone()
    };
    // The path: parameters filled in, sometimes a junk segment appended.
    let mut target = Vec::new();
    for seg in route.path.split('/').skip(1) {
        target.push(b'/');
        match seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            Some(name) => {
                let v = param_value(&mut r, name, t);
                let enc = if r.chance(500) { percent(v.as_bytes(), false).into_bytes() } else { in_target(&mut r, &v) };
                target.extend_from_slice(&enc);
            }
            None => target.extend_from_slice(seg.as_bytes()),
        }
    }
    if r.chance(60) {
        target.push(b'/');
        let v = r.pick(TRAVERSAL).to_string();
        target.extend_from_slice(&in_target(&mut r, &v));
    }
    // The query: mostly the scope's thread, then hostile values of every key.
    let mut query: Vec<Vec<u8>> = Vec::new();
    if route.path.starts_with("/api/") && r.chance(850) {
        query.push(format!("threadId={}", t.thread).into_bytes());
    }
    for _ in 0..r.below(4) {
        let key = r.pick(QUERY_KEYS).to_string();
        let v = match r.below(4) {
            0 => r.pick(HUGE_NUMBERS).to_string(),
            1 => r.pick(&["1", "0", "true", "yes", ""]).to_string(),
            _ => r.pick(TRAVERSAL).to_string(),
        };
        let mut kv = key.into_bytes();
        kv.push(b'=');
        kv.extend_from_slice(&in_target(&mut r, &v));
        query.push(kv);
    }
    if r.chance(40) {
        query.push(b"path=%zz%&&=&threadId".to_vec());
    }
    if !query.is_empty() {
        target.push(b'?');
        target.extend_from_slice(&query.join(&b'&'));
    }

    // Body and content type.
    let oversized = r.chance(4);
    let mut content_type = Some("application/json".to_string());
    let mut body_kind = "json";
    let signed = route.auth == "hmac_auth_context";
    let mut replay = false;
    let body: Vec<u8> = if oversized {
        body_kind = "oversized";
        oversized_body(&route.path)
    } else if signed && r.chance(700) {
        let mut params = params_for(&mut r, &route.path);
        params.remove("auth_context");
        let nonce = fresh_nonce();
        let (secret, issued, kind) = match r.below(10) {
            0 => ("forged-secret".to_string(), now_secs(), "forged_hmac"),
            1 => (t.secret.clone(), now_secs() - 100_000, "expired"),
            2 => (t.secret.clone(), i64::MAX / 2, "future"),
            3 => {
                replay = true;
                (t.secret.clone(), now_secs(), "replayed_nonce")
            }
            _ => (t.secret.clone(), now_secs(), "signed"),
        };
        body_kind = kind;
        let thread = if r.chance(100) { r.pick(TRAVERSAL).to_string() } else { t.thread.clone() };
        let path = String::from_utf8_lossy(&target[..target.iter().position(|b| *b == b'?').unwrap_or(target.len())])
            .into_owned();
        let text = signed_body_with(&secret, &path, &thread, &Value::Object(params), issued, &nonce);
        let mut v: Value = serde_json::from_str(&text).unwrap();
        if r.chance(100) {
            v["auth_context"]["token"] = json!("0".repeat(64));
            body_kind = "zero_token";
        }
        if r.chance(100) {
            v["auth_context"]["issued_at"] = json!("now");
            body_kind = "wrong_type_auth_context";
        }
        serde_json::to_vec(&v).unwrap()
    } else {
        match r.below(10) {
            0..=3 => serde_json::to_vec(&Value::Object(params_for(&mut r, &route.path))).unwrap(),
            4 => serde_json::to_vec(&junk_value(&mut r, 0)).unwrap(),
            5 => {
                body_kind = "multipart";
                content_type = Some("multipart/form-data; boundary=zz".into());
                let name = r.pick(TRAVERSAL).to_string();
                format!("--zz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\r\nhello\r\n--zz--\r\n")
                    .into_bytes()
            }
            6 => {
                content_type = None;
                b"plain bytes".to_vec()
            }
            _ => {
                body_kind = "raw_junk";
                raw_junk_body(&mut r)
            }
        }
    };
    if r.chance(60) {
        content_type = Some(
            r.pick(&["text/plain", "multipart/form-data", "application/json; charset=latin1", "\u{0}"]).to_string(),
        );
    }

    // Authentication headers.
    let mut head = Vec::new();
    head.extend_from_slice(method.as_bytes());
    head.push(b' ');
    head.extend_from_slice(&target);
    head.extend_from_slice(b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    let auth = match r.below(20) {
        0 => "missing",
        1 => "wrong",
        2 => "malformed",
        _ => "valid",
    };
    match (route.auth.as_str(), auth) {
        ("service_token", "valid") => {
            head.extend_from_slice(format!("Authorization: Bearer {SERVICE_TOKEN}\r\n").as_bytes())
        }
        ("admin_token", "valid") => head.extend_from_slice(format!("X-Admin-Token: {ADMIN_TOKEN}\r\n").as_bytes()),
        (_, "wrong") => head.extend_from_slice(
            format!("Authorization: Bearer {ADMIN_TOKEN}\r\nX-Admin-Token: {SERVICE_TOKEN}\r\n").as_bytes(),
        ),
        (_, "malformed") => head.extend_from_slice(
            format!(
                "Authorization: Basic {}\r\nX-Admin-Token: \r\nAuthorization: Bearer\r\n",
                "A".repeat(r.below(6000))
            )
            .as_bytes(),
        ),
        _ => {}
    }
    if let Some(ct) = content_type {
        head.extend_from_slice(format!("Content-Type: {ct}\r\n").as_bytes());
    }
    if r.chance(50) {
        head.extend_from_slice(
            r.pick(&["Range: bytes=99999999999999999999-\r\n", "Range: bytes=5-1\r\n", "Range: bytes=-0,0-0,-\r\n"])
                .as_bytes(),
        );
    }
    // Framing: mostly a correct Content-Length; sometimes chunked with a broken chunk, or a
    // Content-Length that is not a number (never one larger than the body: that would just wait).
    match r.below(40) {
        0 => {
            head.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
            let mut b = format!("{:x}\r\n", body.len() + 7).into_bytes();
            b.extend_from_slice(&body);
            b.extend_from_slice(b"\r\nzz\r\n\r\n");
            return finish(head, b, ri, &method, &target, "bad_chunked", false);
        }
        1 => head.extend_from_slice(format!("Content-Length: -{}\r\n", body.len()).as_bytes()),
        2 => head.extend_from_slice(b"Content-Length: 1e3\r\nContent-Length: 0\r\n"),
        _ => head.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes()),
    }
    head.extend_from_slice(b"\r\n");
    finish(head, body, ri, &method, &target, body_kind, replay)
}

fn finish(
    head: Vec<u8>,
    body: Vec<u8>,
    route: usize,
    method: &str,
    target: &[u8],
    kind: &str,
    replay: bool,
) -> Vec<Wire> {
    let shown: String = String::from_utf8_lossy(target).chars().take(160).collect();
    let label = format!("{method} {shown:?} body={kind} ({} bytes)", body.len());
    let wire = Wire { head, body, route, label };
    if replay {
        let again =
            Wire { head: wire.head.clone(), body: wire.body.clone(), route, label: format!("{} [replay]", wire.label) };
        vec![wire, again]
    } else {
        vec![wire]
    }
}

/// A body over the route's limit: signed routes' base64 allowance, the upload limit, or axum's
/// default JSON limit (2 MiB).
fn oversized_body(path: &str) -> Vec<u8> {
    let n = if path.starts_with("/tools/") {
        (MAX_UPLOAD.min(10 << 20) / 3 * 4 + (2 << 20)) as usize
    } else if path.starts_with("/api/workspace") {
        MAX_UPLOAD as usize + 1
    } else {
        (2 << 20) + 1
    };
    let mut b = b"{\"content\":\"".to_vec();
    b.resize(n, b'a');
    b.extend_from_slice(b"\"}");
    b
}

/// Counts of one fuzz run.
#[derive(Debug, Default)]
pub struct Report {
    pub sent: u64,
    pub by_class: BTreeMap<String, u64>,
    /// Answers by `status code` (e.g. `401 invalid_signature`).
    pub by_code: BTreeMap<String, u64>,
    pub allowed_5xx: BTreeMap<String, u64>,
    pub per_route: BTreeMap<usize, u64>,
    /// `(index, label, what)` of every unexpected 5xx or missing answer (first 50 kept).
    pub failures: Vec<(u64, String, String)>,
    pub failure_count: u64,
    pub elapsed: Duration,
    pub stopped_early: Option<String>,
}

/// Sends requests `0..count` of `seed` from `threads` threads, stopping at `max_time` or when the
/// daemon stops answering; `alive` is asked every 500 requests.
pub fn run(
    seed: u64,
    count: u64,
    max_time: Duration,
    threads: usize,
    routes: &[Route],
    t: &Target,
    alive: &(dyn Fn() -> Option<String> + Sync),
) -> Report {
    let next = AtomicU64::new(0);
    let report = Mutex::new(Report::default());
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count || start.elapsed() > max_time || report.lock().unwrap().stopped_early.is_some() {
                    break;
                }
                if i % 500 == 499 {
                    if let Some(why) = alive() {
                        report.lock().unwrap().stopped_early = Some(format!("after request {i}: {why}"));
                        break;
                    }
                }
                for w in generate(seed, i, routes, t) {
                    let outcome = raw_request(t.addr, &w.head, &w.body, 60);
                    let mut rep = report.lock().unwrap();
                    rep.sent += 1;
                    *rep.per_route.entry(w.route).or_default() += 1;
                    let bad = match &outcome {
                        Outcome::Answer(a) => {
                            *rep.by_class.entry(format!("{}xx", a.status / 100)).or_default() += 1;
                            *rep.by_code.entry(format!("{} {}", a.status, a.code)).or_default() += 1;
                            if a.status >= 500 {
                                if ALLOWED_5XX.contains(&(a.status, a.code.as_str())) {
                                    *rep.allowed_5xx.entry(format!("{} {}", a.status, a.code)).or_default() += 1;
                                    None
                                } else {
                                    Some(format!("answered {} {:?}", a.status, a.code))
                                }
                            } else {
                                None
                            }
                        }
                        Outcome::NoAnswer { body_sent, err } => {
                            *rep.by_class.entry("no_answer".into()).or_default() += 1;
                            // The server may refuse an oversized body and close while it is still
                            // being sent: then the answer can be lost in the reset. Otherwise
                            // every request gets an answer.
                            (*body_sent || w.body.len() < (1 << 20)).then(|| format!("no answer: {err}"))
                        }
                    };
                    if let Some(what) = bad {
                        rep.failure_count += 1;
                        if rep.failures.len() < 50 {
                            rep.failures.push((i, w.label.clone(), what));
                        }
                    }
                }
            });
        }
    });
    let mut rep = report.into_inner().unwrap();
    rep.elapsed = start.elapsed();
    rep
}
