//! Signed `/tools/*` requests (issue 4, acceptance a): the golden vector of seed 003 §4.4 through the
//! real route, a differential test against Python's own signer (`tests/sign_bodies.py`, at least 1,000
//! generated bodies), any changed byte refused, replayed nonces and stale timestamps refused (401),
//! and the secret generated on first start.

pub mod tools_support;
pub mod workspace_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use reqwest::StatusCode;
use scopefs::signing::{self, CanonValue, SigningError};
use serde_json::{json, Value};
use tools_support::{
    call, fresh_nonce, now_secs, peak_rss_kib, post_raw, signed_body, signed_body_with, start_daemon, SECRET,
};

const GOLDEN_SECRET: &str = "test-hmac-secret-for-unit-tests-only";
const GOLDEN_TOKEN: &str = "06af87716e9c3ba83441362dad2faa543c5db19d1c47fb937cd2ffe29cee1d21";
const GOLDEN_ISSUED_AT: i64 = 1716500000;

/// The golden body as a client sends it (key order and spacing differ from the canonical form).
fn golden_body(token: &str) -> String {
    format!(
        r#"{{"command": "echo hello", "environment_id": "env_test123", "auth_context": {{"user_id": "test_user", "issued_at": 1716500000, "nonce": "abc123def456", "object_scope": {{"read": ["objects/in/data.csv"], "write_prefixes": ["jobs/job_1/artifacts/"]}}, "token": "{token}"}}}}"#
    )
}

/// Runs `tests/sign_bodies.py`; returns its records.
fn python_bodies(secret: &str, count: usize, seed: u64, extra: &[&str]) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/sign_bodies.py");
    let out = Command::new("python3")
        .arg(script)
        .args([secret, &count.to_string(), &seed.to_string()])
        .args(extra)
        .output()
        .expect("python3 must be installed to run the differential signing test");
    assert!(out.status.success(), "sign_bodies.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let records: Vec<Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), count);
    records
}

/// The canonical JSON of a body without its token, and the token (for judging mutated bodies).
fn canonical_and_token(body: &[u8]) -> Option<(String, String)> {
    let mut v = signing::parse(body).ok()?;
    let CanonValue::Object(top) = &mut v else { return None };
    let Some(CanonValue::Object(ctx)) = top.get_mut("auth_context") else { return None };
    let Some(CanonValue::Str(token)) = ctx.remove("token") else { return None };
    Some((v.to_canonical(), token))
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn python_signed_bodies_verify_and_any_changed_byte_is_refused() {
    let records = python_bodies(SECRET, 1200, 20240521, &[]);
    let now = now_secs();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut refused_bytes, mut equivalent_bytes) = (0usize, 0usize);
    for (i, rec) in records.iter().enumerate() {
        let path = rec["path"].as_str().unwrap();
        let body = rec["body"].as_str().unwrap().as_bytes();
        let ctx = signing::verify(SECRET.as_bytes(), "POST", path, body)
            .unwrap_or_else(|e| panic!("body {i} signed by Python does not verify ({e}): {}", rec["body"]));
        signing::check_window(ctx.issued_at, now, 300).unwrap();
        assert_eq!(ctx.thread_id.as_deref(), Some("thr_differential"));

        // Python changed one value (one character, digit or flag) and kept the token.
        let mutated = rec["mutated"].as_str().unwrap().as_bytes();
        assert!(
            signing::verify(SECRET.as_bytes(), "POST", path, mutated).is_err(),
            "body {i} with a changed value verifies: {}",
            rec["mutated"]
        );
        // Another method, path or secret never verifies.
        assert_eq!(signing::verify(SECRET.as_bytes(), "PUT", path, body), Err(SigningError::BadSignature));
        assert_eq!(signing::verify(SECRET.as_bytes(), "POST", "/tools/other", body), Err(SigningError::BadSignature));
        assert_eq!(signing::verify(b"another-secret", "POST", path, body), Err(SigningError::BadSignature));

        // Single changed bytes anywhere: refused unless the change is invisible to the signed content
        // (whitespace, an equivalent escape such as \u00e9 for é), judged independently of verify.
        let original = canonical_and_token(body).expect("a signed body parses");
        for _ in 0..4 {
            let mut copy = body.to_vec();
            let at = rng.below(copy.len());
            let byte = loop {
                let b = (rng.next() & 0x7f) as u8;
                if b != copy[at] {
                    break b;
                }
            };
            copy[at] = byte;
            let verdict = signing::verify(SECRET.as_bytes(), "POST", path, &copy);
            if canonical_and_token(&copy).as_ref() == Some(&original) {
                assert!(verdict.is_ok(), "body {i}: an invisible change at byte {at} was refused");
                equivalent_bytes += 1;
            } else {
                assert!(verdict.is_err(), "body {i}: changed byte {at} ({byte:#x}) still verifies");
                refused_bytes += 1;
            }
        }
    }
    assert!(
        refused_bytes > 3 * records.len(),
        "most byte changes alter the content ({refused_bytes}, {equivalent_bytes})"
    );
}

#[test]
fn golden_vector_and_python_bodies_verify_through_the_real_routes() {
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("clock-offset");
    let clock_env = clock.to_string_lossy().into_owned();
    let d = start_daemon(&[("SCOPEFS_HMAC_SECRET", GOLDEN_SECRET), ("SCOPEFS_TEST_CLOCK_FILE", &clock_env)]);
    d.provision("thr_http");

    // At real time the golden vector is far outside the window.
    let stale = post_raw(&d, "/tools/execute_command", golden_body(GOLDEN_TOKEN));
    assert_eq!(
        (stale.status, stale.code().as_str()),
        (StatusCode::UNAUTHORIZED, "signature_expired"),
        "{}",
        stale.text()
    );
    // With the daemon's clock at the vector's time, the signature and window pass; the vector names no
    // thread, so the answer is the 400 that follows verification.
    std::fs::write(&clock, (GOLDEN_ISSUED_AT - now_secs() + 5).to_string()).unwrap();
    let golden = post_raw(&d, "/tools/execute_command", golden_body(GOLDEN_TOKEN));
    assert_ne!(golden.status, StatusCode::NOT_FOUND, "no /tools/execute_command route: {}", golden.text());
    assert_eq!(
        (golden.status, golden.code().as_str()),
        (StatusCode::BAD_REQUEST, "invalid_thread_id"),
        "{}",
        golden.text()
    );
    let tampered =
        post_raw(&d, "/tools/execute_command", golden_body(GOLDEN_TOKEN).replace("echo hello", "echo hellp"));
    assert_eq!((tampered.status, tampered.code().as_str()), (StatusCode::UNAUTHORIZED, "invalid_signature"));
    let wrong_route = post_raw(&d, "/tools/list_dir", golden_body(GOLDEN_TOKEN));
    assert_eq!((wrong_route.status, wrong_route.code().as_str()), (StatusCode::UNAUTHORIZED, "invalid_signature"));
    std::fs::remove_file(&clock).unwrap();

    // Python-signed bodies with generated content, through a real route, each accepted once.
    let records = python_bodies(GOLDEN_SECRET, 12, 7, &["--http", "--path", "/tools/list_dir", "--thread", "thr_http"]);
    for rec in &records {
        let body = rec["body"].as_str().unwrap().to_string();
        let ok = post_raw(&d, "/tools/list_dir", body.clone());
        assert_eq!(ok.status, StatusCode::OK, "{} for {}", ok.text(), rec["body"]);
        assert_eq!(ok.json()["path"], "/workspace");
        let replay = post_raw(&d, "/tools/list_dir", body);
        assert_eq!((replay.status, replay.code().as_str()), (StatusCode::UNAUTHORIZED, "nonce_replayed"));
        let changed = post_raw(&d, "/tools/list_dir", rec["mutated"].as_str().unwrap().to_string());
        assert_eq!(changed.status, StatusCode::UNAUTHORIZED, "{}", changed.text());
    }
}

#[test]
fn replays_stale_timestamps_and_malformed_auth_are_401() {
    let d = start_daemon(&[]);
    d.provision("thr_window");
    let params = json!({"path": "/workspace"});
    let path = "/tools/list_dir";

    let nonce = fresh_nonce();
    let body = signed_body(path, "thr_window", &params, now_secs(), &nonce);
    assert_eq!(post_raw(&d, path, body.clone()).status, StatusCode::OK);
    let replay = post_raw(&d, path, body);
    assert_eq!((replay.status, replay.code().as_str()), (StatusCode::UNAUTHORIZED, "nonce_replayed"));
    // The nonce stays used even in a freshly signed body with another timestamp.
    let again = post_raw(&d, path, signed_body(path, "thr_window", &params, now_secs() - 1, &nonce));
    assert_eq!(again.code(), "nonce_replayed");

    for skew in [-400, -301, 301, 4000] {
        let a = post_raw(&d, path, signed_body(path, "thr_window", &params, now_secs() + skew, &fresh_nonce()));
        assert_eq!((a.status, a.code().as_str()), (StatusCode::UNAUTHORIZED, "signature_expired"), "skew {skew}");
    }
    for skew in [-280, 280] {
        let a = post_raw(&d, path, signed_body(path, "thr_window", &params, now_secs() + skew, &fresh_nonce()));
        assert_eq!(a.status, StatusCode::OK, "skew {skew}: {}", a.text());
    }

    let good = signed_body(path, "thr_window", &params, now_secs(), &fresh_nonce());
    let mut v: Value = serde_json::from_str(&good).unwrap();
    let cases: Vec<(String, &str)> = vec![
        (json!({"path": "/workspace"}).to_string(), "invalid_auth_context"),
        (
            {
                v["auth_context"].as_object_mut().unwrap().remove("token");
                v.to_string()
            },
            "invalid_auth_context",
        ),
        (
            signed_body_with("wrong-secret", path, "thr_window", &params, now_secs(), &fresh_nonce()),
            "invalid_signature",
        ),
        (good.replace("\"nonce\":\"", "\"nonce\":\"x"), "invalid_signature"),
    ];
    for (body, code) in cases {
        let a = post_raw(&d, path, body);
        assert_eq!((a.status, a.code().as_str()), (StatusCode::UNAUTHORIZED, code), "{}", a.text());
    }
    let not_json = post_raw(&d, path, "{not json".into());
    assert_eq!((not_json.status, not_json.code().as_str()), (StatusCode::BAD_REQUEST, "invalid_json"));
    // A signed request of an unknown thread is refused after verification.
    let unknown = call(&d, "list_dir", "thr_nobody", params.clone());
    assert_eq!((unknown.status, unknown.code().as_str()), (StatusCode::NOT_FOUND, "scope_not_found"));
    // Nothing of the secret or tokens reaches the log.
    assert!(!d.log_text().contains(SECRET));
}

/// A body with a well-formed but wrongly signed `auth_context` around `rest` (JSON members).
fn unsigned_body(thread: &str, rest: &str) -> String {
    format!(
        r#"{{"auth_context":{{"user_id":"user-1","thread_id":"{thread}","issued_at":{},"nonce":"{}","token":"{}"}},{rest}}}"#,
        now_secs(),
        fresh_nonce(),
        "0".repeat(64)
    )
}

#[test]
fn bodies_are_bounded_before_authentication() {
    let d = start_daemon(&[]);
    d.provision("thr_budget");
    let path = "/tools/list_dir";

    // A declared length over the body limit is 413 before the body is read: the client sends the
    // headers and a few bytes only, and still gets its answer (the old code waited for the body).
    let addr = d.url("").trim_start_matches("http://").to_string();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n[0,0,0,"
    )
    .unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).expect("an answer before the body was sent");
    assert_eq!(&head, b"HTTP/1.1 413");
    drop(s);

    // `[0,0,…]` of 14 MB: refused as too large without the daemon's memory growing by its parse.
    let before = peak_rss_kib(d.pid());
    let big = format!("[{}0]", "0,".repeat(7_000_000));
    let a = post_raw(&d, path, big);
    assert_eq!((a.status, a.code().as_str()), (StatusCode::PAYLOAD_TOO_LARGE, "too_large"), "{}", a.text());
    let grown = peak_rss_kib(d.pid()).saturating_sub(before);
    assert!(grown < 100 * 1024, "peak RSS grew by {grown} KiB");

    // Under the size limit but over the value budget (1.1 M values in 2.2 MB): refused while it is
    // parsed, before its signature is looked at (the old code parsed it all, then answered 401).
    let many = unsigned_body("thr_budget", &format!(r#""path":"/workspace","pad":[{}0]"#, "0,".repeat(1_100_000)));
    let a = post_raw(&d, path, many);
    assert_eq!((a.status, a.code().as_str()), (StatusCode::PAYLOAD_TOO_LARGE, "too_large"), "{}", a.text());
    // Nested deeper than `tools_max_json_depth` (64): 400 invalid_json, not a signature check.
    let deep = unsigned_body("thr_budget", &format!(r#""pad":{}{}"#, "[".repeat(100), "]".repeat(100)));
    let a = post_raw(&d, path, deep);
    assert_eq!((a.status, a.code().as_str()), (StatusCode::BAD_REQUEST, "invalid_json"), "{}", a.text());
    // A root that is not an object is refused before it is parsed.
    let a = post_raw(&d, path, "[1,2,3]".into());
    assert_eq!((a.status, a.code().as_str()), (StatusCode::BAD_REQUEST, "invalid_json"), "{}", a.text());

    // The refusals are counted per bound, and a normal signed call still works.
    let metrics = d.get("/metrics").text();
    for bound in ["body_bytes", "json_values", "json_depth"] {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("scopefs_limit_refused_total{{bound=\"{bound}\"}}")))
            .unwrap_or_else(|| panic!("no refusal count of {bound} in /metrics"));
        assert_ne!(line.rsplit(' ').next(), Some("0"), "{line}");
    }
    let ok = call(&d, "list_dir", "thr_budget", json!({"path": "/workspace"}));
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
}

#[test]
fn the_secret_is_generated_once_on_first_start() {
    let d = workspace_support::Daemon::start();
    d.provision("thr_gen");
    let file = d.dir.path().join("data/control/hmac-secret");
    let secret = std::fs::read_to_string(&file).expect("the daemon writes <data_dir>/control/hmac-secret");
    let secret = secret.trim();
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(secret.len(), 64);
    let path = "/tools/list_dir";
    let params = json!({});
    let ok = post_raw(&d, path, signed_body_with(secret, path, "thr_gen", &params, now_secs(), &fresh_nonce()));
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    let other = post_raw(&d, path, signed_body(path, "thr_gen", &params, now_secs(), &fresh_nonce()));
    assert_eq!(other.code(), "invalid_signature");
}
#[test]
fn floats_print_like_python_json() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/sign_bodies.py");
    let out =
        Command::new("python3").args([script, "--floats", "200000", "99"]).output().expect("python3 must be installed");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut n = 0;
    for line in text.lines() {
        let (bits, python) = line.split_once(' ').unwrap();
        let f = f64::from_bits(u64::from_str_radix(bits, 16).unwrap());
        assert_eq!(signing::python_float_repr(f), python, "bits {bits}");
        n += 1;
    }
    assert_eq!(n, 200000);
}
