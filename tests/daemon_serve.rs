//! End-to-end tests of the `scopefs` binary: `serve` (health, readiness, auth, provisioning, mounts,
//! SIGTERM, restart/remount) and `doctor`.

pub mod serve_process;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use serve_process::{client, free_port, mounts_under, write_config, ServeProcess, BIN};

/// How long a SIGTERM'd daemon may take to exit.
const SIGTERM_WAIT: Duration = Duration::from_secs(60);

/// Writes a config for a local-store daemon under `dir` and returns its path.
fn local_config(dir: &Path, port: u16) -> PathBuf {
    write_config(dir, port, "fuse.attr_ttl_ms = 0\n\n[store]\nkind = \"local\"\n")
}

/// Sends a request and returns its status and JSON body (every answer of the API is JSON).
fn call(req: reqwest::blocking::RequestBuilder) -> (StatusCode, Value) {
    let resp = req.send().expect("request failed");
    let status = resp.status();
    let text = resp.text().unwrap();
    let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("non-JSON body ({e}): {text}"));
    (status, body)
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_else(|| panic!("not an error body: {body}"))
}

#[test]
fn serve_provisions_mounts_stops_and_remounts() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = local_config(tmp.path(), port);
    let http = client();
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve-1.log", &[]);
    daemon.wait_ready(&http);
    let base = daemon.base.clone();

    let (status, body) = call(http.get(format!("{base}/health")));
    assert_eq!((status, body), (StatusCode::OK, json!({"status": "ok"})));

    // The service token was generated on first start, private to root.
    let token_file = tmp.path().join("data/control/service-token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let token = std::fs::read_to_string(&token_file).unwrap().trim().to_owned();
    assert_eq!(token.len(), 64);

    // Authentication: none or a wrong token is 401 with a JSON error.
    let by_thread = |t: &str| format!("{base}/internal/workspace-scopes/by-thread/{t}");
    let (status, body) = call(http.get(by_thread("thread-1")));
    assert_eq!((status, error_code(&body)), (StatusCode::UNAUTHORIZED, "unauthorized"));
    let (status, body) = call(http.get(by_thread("thread-1")).bearer_auth(format!("{token}x")));
    assert_eq!((status, error_code(&body)), (StatusCode::UNAUTHORIZED, "unauthorized"));

    // Unknown thread: 404; invalid thread id: 400.
    let (status, body) = call(http.get(by_thread("thread-1")).bearer_auth(&token));
    assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "scope_not_found"));
    let (status, body) = call(http.get(by_thread("bad%20id")).bearer_auth(&token));
    assert_eq!((status, error_code(&body)), (StatusCode::BAD_REQUEST, "invalid_thread_id"));

    // Provisioning is idempotent on operation_id and on the thread.
    let provision = |op: &str, thread: &str| {
        call(
            http.post(format!("{base}/internal/workspace-scopes/provision"))
                .bearer_auth(&token)
                .json(&json!({"operation_id": op, "primary_thread_id": thread})),
        )
    };
    let (status, first) = provision("op-1", "thread-1");
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!((first["state"].as_str(), first["created"].as_bool()), (Some("draft"), Some(true)));
    let scope_id = first["scope_id"].as_str().unwrap().to_owned();
    let (status, again) = provision("op-1", "thread-1");
    assert_eq!((status, again["scope_id"].as_str()), (StatusCode::OK, Some(scope_id.as_str())));
    let (status, other_op) = provision("op-2", "thread-1");
    assert_eq!((status, other_op["scope_id"].as_str()), (StatusCode::OK, Some(scope_id.as_str())));
    let (status, body) = provision("op-1", "thread-2");
    assert_eq!((status, error_code(&body)), (StatusCode::CONFLICT, "idempotency_key_conflict"));
    let (status, body) = provision("op-3", "no/slash");
    assert_eq!((status, error_code(&body)), (StatusCode::BAD_REQUEST, "invalid_thread_id"));

    // The mount route returns a real mountpoint.
    let (status, mount) =
        call(http.get(format!("{base}/internal/workspace-scopes/{scope_id}/mount")).bearer_auth(&token));
    assert_eq!(status, StatusCode::OK, "{mount}");
    let mountpoint = PathBuf::from(mount["mountpoint"].as_str().unwrap());
    assert_eq!(mountpoint, tmp.path().join("mnt").join(&scope_id));
    assert!(mounts_under(&daemon.mount_root).contains(&mountpoint.to_str().unwrap().to_owned()));
    let content = b"scopefs end-to-end content\n".repeat(100);
    std::fs::write(mountpoint.join("hello.txt"), &content).unwrap();
    assert_eq!(std::fs::read(mountpoint.join("hello.txt")).unwrap(), content);
    // `bind_source` is the real mount an orchestrator binds (outside the mount root's listing);
    // `mountpoint`, the host view, never follows a symlink.
    let bind_source = PathBuf::from(mount["bind_source"].as_str().unwrap());
    assert_eq!(bind_source, tmp.path().join(".mnt.real").join(&scope_id));
    assert_eq!(std::fs::read(bind_source.join("hello.txt")).unwrap(), content);
    std::os::unix::fs::symlink("hello.txt", mountpoint.join("link")).unwrap();
    assert_eq!(std::fs::read(bind_source.join("link")).unwrap(), content);
    assert_eq!(std::fs::read(mountpoint.join("link")).unwrap_err().raw_os_error(), Some(libc::ELOOP));
    std::fs::remove_file(mountpoint.join("link")).unwrap();
    let (status, body) =
        call(http.get(format!("{base}/internal/workspace-scopes/{}/mount", uuid_like())).bearer_auth(&token));
    assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "scope_not_found"));

    // by-thread shows the record and the usage.
    let (status, rec) = call(http.get(by_thread("thread-1")).bearer_auth(&token));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(rec["scope_id"].as_str(), Some(scope_id.as_str()));
    assert_eq!(rec["state"].as_str(), Some("draft"));
    assert_eq!(rec["revision"].as_u64(), Some(2));
    assert_eq!(rec["usage"], json!({"files": 1, "bytes": content.len(), "inodes": 1, "links": 0}));

    // `scope create` refuses beside a running daemon (review D8: the data directory's lock) and
    // creates nothing; `scope ls` only reads the registry and works.
    let create = || {
        Command::new(BIN)
            .arg("--config")
            .arg(&config)
            .args(["scope", "create", "--thread", "thread-cli"])
            .output()
            .unwrap()
    };
    let out = create();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "scope create ran beside the daemon");
    assert!(err.contains("a scopefs daemon is running on this data directory; stop it first"), "{err}");
    let (status, _) = call(http.get(by_thread("thread-cli")).bearer_auth(&token));
    assert_eq!(status, StatusCode::NOT_FOUND);
    let out = Command::new(BIN).arg("--config").arg(&config).args(["scope", "ls"]).output().unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && listing.contains(&scope_id), "{listing}");

    // SIGTERM: exit 0, no mount left.
    let status = daemon.terminate(SIGTERM_WAIT);
    assert!(status.success(), "exit status {status}; log:\n{}", daemon.log_text());
    assert!(mounts_under(&daemon.mount_root).is_empty(), "mounts left after SIGTERM");
    assert!(mounts_under(&daemon.real_root).is_empty(), "real mounts left after SIGTERM");
    let log = daemon.log_text();
    assert!(!log.contains(&token), "the log contains the service token");
    drop(daemon);

    // Stopped: `scope create` works on the registry directly and does not mount; the next start
    // mounts it with every draft scope.
    let out = create();
    assert!(out.status.success(), "scope create failed: {}", String::from_utf8_lossy(&out.stderr));
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let cli_scope = listing.lines().nth(1).and_then(|l| l.split_whitespace().next()).expect("a scope row").to_owned();
    let cli_mountpoint = tmp.path().join("mnt").join(&cli_scope);
    assert!(mounts_under(&tmp.path().join("mnt")).is_empty());

    // Restart on the same data (as a systemd notify service): the scope is remounted at start and
    // the file is intact; READY=1 comes once ready, STOPPING=1 at shutdown.
    let notify_path = tmp.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let notify_env = [("NOTIFY_SOCKET", notify_path.to_str().unwrap())];
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve-2.log", &notify_env);
    daemon.wait_ready(&http);
    assert_eq!(recv_notification(&notify), "READY=1");
    assert!(
        mounts_under(&daemon.mount_root).contains(&mountpoint.to_str().unwrap().to_owned()),
        "scope not remounted at start; log:\n{}",
        daemon.log_text()
    );
    assert_eq!(std::fs::read(mountpoint.join("hello.txt")).unwrap(), content);
    let (status, rec) = call(http.get(by_thread("thread-1")).bearer_auth(&token));
    assert_eq!((status, rec["scope_id"].as_str()), (StatusCode::OK, Some(scope_id.as_str())));
    let (status, cli_rec) = call(http.get(by_thread("thread-cli")).bearer_auth(&token));
    assert_eq!((status, cli_rec["state"].as_str()), (StatusCode::OK, Some("draft")), "{cli_rec}");
    assert_eq!(cli_rec["scope_id"].as_str(), Some(cli_scope.as_str()));
    assert!(
        mounts_under(&daemon.mount_root).contains(&cli_mountpoint.to_str().unwrap().to_owned()),
        "the CLI-created scope was not mounted at start"
    );
    let (status, _) = call(http.get(format!("{base}/internal/workspace-scopes/{cli_scope}/mount")).bearer_auth(&token));
    assert_eq!(status, StatusCode::OK);
    let status = daemon.terminate(SIGTERM_WAIT);
    assert!(status.success(), "exit status {status}; log:\n{}", daemon.log_text());
    assert_eq!(recv_notification(&notify), "STOPPING=1");
    assert!(mounts_under(&daemon.mount_root).is_empty(), "mounts left after the second SIGTERM");
    assert!(mounts_under(&daemon.real_root).is_empty(), "real mounts left after SIGTERM");
}

/// Review L12: a client that sends half a request header is disconnected after
/// `limits.http_header_timeout_secs`, while other clients are served meanwhile.
#[test]
fn a_slowloris_client_is_disconnected_while_others_are_served() {
    use std::io::{Read, Write};
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config =
        write_config(tmp.path(), port, "[store]\nkind = \"local\"\n\n[limits]\nhttp_header_timeout_secs = 2\n");
    // No kept connections: an idle kept-alive connection waits for the headers of its next request,
    // so the server cuts it after the same 2 s, and a request sent on it as it is cut fails.
    let http = reqwest::blocking::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve-slow.log", &[]);
    daemon.wait_ready(&http);
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // A connection that sends nothing at all holds a connection slot just the same.
    let mut silent = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let started = std::time::Instant::now();
    // Served while the slow client holds its connection.
    let (status, _) = call(http.get(format!("{}/health", daemon.base)));
    assert_eq!(status, StatusCode::OK);
    let mut answer = Vec::new();
    match slow.read_to_end(&mut answer) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the half-sent request was not cut off ({e}); answer so far: {answer:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(25), "closed only after {:?}", started.elapsed());
    assert!(!String::from_utf8_lossy(&answer).contains("200 OK"), "an incomplete request was answered");
    match silent.read_to_end(&mut Vec::new()) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("a silent connection was kept open ({e})"),
    }
    let (status, _) = call(http.get(format!("{}/health", daemon.base)));
    assert_eq!(status, StatusCode::OK);
    assert!(daemon.terminate(SIGTERM_WAIT).success());
}

fn recv_notification(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).expect("no service-manager notification within 60 s");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// A well-formed scope id that no scope has.
fn uuid_like() -> String {
    "01234567-89ab-7def-8123-456789abcdef".to_owned()
}

fn doctor(config: &Path) -> (bool, String) {
    let out = Command::new(BIN).arg("--config").arg(config).arg("doctor").output().expect("running doctor");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn doctor_passes_on_a_local_store_and_fails_on_an_unreachable_s3() {
    let tmp = tempfile::tempdir().unwrap();
    let config = local_config(tmp.path(), free_port());
    let (ok, out) = doctor(&config);
    assert!(ok, "doctor failed:\n{out}");
    for check in ["fuse-device", "mount-permission", "mount-root", "registry", "object-store"] {
        assert!(out.lines().any(|l| l.starts_with(&format!("PASS {check}:"))), "no PASS {check}:\n{out}");
    }
    assert!(!out.contains("FAIL"), "{out}");

    let s3 = tmp.path().join("s3.toml");
    let text = format!(
        "data_dir = {data:?}\nmount_root = {mnt:?}\nstore_timeout_ms = 2000\nstore_attempts = 1\n\n[store]\nkind = \"s3\"\n\
         endpoint = \"http://127.0.0.1:1\"\nregion = \"garage\"\nbucket = \"nothing\"\n\
         access_key_id = \"GKtest\"\nsecret_access_key = \"not-a-secret\"\n",
        data = tmp.path().join("data-s3"),
        mnt = tmp.path().join("mnt-s3"),
    );
    std::fs::write(&s3, text).unwrap();
    let (ok, out) = doctor(&s3);
    assert!(!ok, "doctor passed with an unreachable store:\n{out}");
    assert!(out.lines().any(|l| l.starts_with("FAIL object-store:")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("PASS registry:")), "{out}");
    assert!(!out.contains("not-a-secret"), "doctor printed the secret key:\n{out}");

    // `serve` refuses to start when the startup probe fails, saying why.
    let mut s3_serve = std::fs::read_to_string(&s3).unwrap();
    s3_serve.insert_str(0, &format!("listen = \"127.0.0.1:{}\"\n", free_port()));
    std::fs::write(&s3, s3_serve).unwrap();
    let out = Command::new(BIN).arg("--config").arg(&s3).arg("serve").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve started with an unreachable store");
    assert!(stderr.contains("object store probe"), "{stderr}");
    assert!(!stderr.contains("not-a-secret"), "serve printed the secret key:\n{stderr}");
}
