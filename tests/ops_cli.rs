//! Operations (issue 6) through the `scopefs` binary: `serve --print-config` and config refusal,
//! systemd-style start (READY=1 only once mounts and the API are up; SIGTERM → STOPPING=1, no
//! mount left, exit 0), `fsck [--repair]` finding a block deleted behind the daemon's back, and the
//! data directory's lock (offline commands and a second daemon refuse beside a running one).

pub mod serve_process;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use reqwest::blocking::Client;
use reqwest::StatusCode;
use serve_process::{free_port, mounts_under, write_config, ServeProcess, BIN};

/// How long a SIGTERM'd daemon may take to exit.
const SIGTERM_WAIT: Duration = Duration::from_secs(90);

/// A local-store config under `dir` (close durability: bytes are in the store once close returns).
fn local_config(dir: &Path, port: u16) -> PathBuf {
    write_config(dir, port, "durability = \"close\"\nfuse.attr_ttl_ms = 0\n\n[store]\nkind = \"local\"\n")
}

fn scopefs(config: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .env_remove("SCOPEFS_SERVICE_TOKEN")
        .env_remove("NOTIFY_SOCKET")
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("running scopefs")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn client() -> Client {
    Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

/// Creates a scope for `thread` with the CLI; returns its id.
fn create_scope(config: &Path, thread: &str) -> String {
    let out = scopefs(config, &["scope", "create", "--thread", thread]);
    assert!(out.status.success(), "scope create failed:\n{}", text(&out));
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let row = listing.lines().nth(1).unwrap_or_else(|| panic!("no scope row:\n{listing}"));
    row.split_whitespace().next().unwrap().to_owned()
}

#[test]
fn print_config_redacts_secrets_and_bad_config_is_refused_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("s3.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:7999\"\nservice_token = \"tok-in-file-123\"\n\n[store]\nkind = \"s3\"\nregion = \"garage\"\n\
         bucket = \"bkt\"\naccess_key_id = \"GKvisible\"\nsecret_access_key = \"s3-secret-456\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .env("SCOPEFS_HMAC_SECRET", "hmac-from-env-789")
        .env("SCOPEFS_ADMIN_TOKEN", "admin-from-env-000")
        .env("SCOPEFS_QUOTA_BYTES", "12345")
        .arg("--config")
        .arg(&config)
        .args(["serve", "--print-config"])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", text(&out));
    for secret in ["tok-in-file-123", "s3-secret-456", "hmac-from-env-789", "admin-from-env-000"] {
        assert!(!text(&out).contains(secret), "{secret} printed:\n{printed}");
    }
    assert_eq!(printed.matches("\"<redacted>\"").count(), 4, "{printed}");
    // Effective values: file and environment merged.
    for line in
        ["listen = \"127.0.0.1:7999\"", "quota_bytes = 12345", "bucket = \"bkt\"", "access_key_id = \"GKvisible\""]
    {
        assert!(printed.lines().any(|l| l == line), "missing `{line}`:\n{printed}");
    }

    // The shipped default config is accepted.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/scopefs.toml");
    let out = scopefs(&shipped, &["serve", "--print-config"]);
    assert!(out.status.success(), "packaging/scopefs.toml refused:\n{}", text(&out));

    // Unknown keys and bad values: refused, naming the key, non-zero exit.
    let cases: [(&str, &str); 4] = [
        ("no_such_key = 1\n", "no_such_key"),
        ("[fuse]\nthreadz = 2\n", "threadz"),
        ("block_size = 10\n", "block_size"),
        ("[executor]\nnetwork = \"host\"\n", "executor.network"),
    ];
    for (body, key) in cases {
        std::fs::write(&config, body).unwrap();
        let out = scopefs(&config, &["serve", "--print-config"]);
        assert!(!out.status.success(), "{body:?} accepted");
        assert!(text(&out).contains(key), "{body:?}: message does not name {key}:\n{}", text(&out));
    }
    let out = Command::new(BIN)
        .env("SCOPEFS_DRAFT_TTL_HOURS", "soon")
        .arg("--config")
        .arg(&shipped)
        .args(["serve", "--print-config"])
        .output()
        .unwrap();
    assert!(!out.status.success() && text(&out).contains("SCOPEFS_DRAFT_TTL_HOURS"), "{}", text(&out));
}

fn recv(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).expect("no service-manager notification within the timeout");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn notify_start_sends_ready_after_mounts_and_api_and_sigterm_unmounts_and_exits_0() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = local_config(tmp.path(), port);
    // Scopes that exist before start must be mounted before READY=1.
    let scopes: Vec<String> = (0..3).map(|i| create_scope(&config, &format!("pre-{i}"))).collect();

    let notify_path = tmp.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
    let notify_env = [("NOTIFY_SOCKET", notify_path.to_str().unwrap())];
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve.log", &notify_env);
    let http = client();

    assert_eq!(recv(&notify), "READY=1", "log:\n{}", daemon.log_text());
    // At the moment READY=1 arrived: /ready answers 200 and every scope is mounted.
    let ready = http.get(format!("{}/ready", daemon.base)).send().expect("API not up at READY=1");
    assert_eq!(ready.status(), StatusCode::OK);
    let mounted = mounts_under(&daemon.mount_root);
    for id in &scopes {
        let mp = daemon.mount_root.join(id);
        assert!(mounted.contains(&mp.to_str().unwrap().to_owned()), "{id} not mounted at READY=1: {mounted:?}");
    }
    std::fs::write(daemon.mount_root.join(&scopes[0]).join("f.txt"), b"hello").unwrap();
    // Exactly one READY=1.
    notify.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut buf = [0u8; 64];
    assert!(notify.recv(&mut buf).is_err(), "a second notification before SIGTERM");
    notify.set_read_timeout(Some(Duration::from_secs(90))).unwrap();

    let status = daemon.terminate(SIGTERM_WAIT);
    assert_eq!(recv(&notify), "STOPPING=1");
    assert!(status.success(), "exit status {status}; log:\n{}", daemon.log_text());
    assert_eq!(status.code(), Some(0));
    assert!(mounts_under(&daemon.mount_root).is_empty(), "mounts left after SIGTERM");
    assert!(mounts_under(&daemon.real_root).is_empty(), "real mounts left after SIGTERM");
}

#[test]
fn fsck_finds_a_deleted_block_and_reads_of_the_damaged_file_fail() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = local_config(tmp.path(), port);
    let scope = create_scope(&config, "fsck-thread");

    // Write two files through the mount (close durability: uploaded when close returns).
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve-1.log", &[]);
    daemon.wait_ready(&client());
    let mp = daemon.mount_root.join(&scope);
    std::fs::create_dir(mp.join("docs")).unwrap();
    std::fs::write(mp.join("docs/victim.txt"), b"victim bytes that will lose their block").unwrap();
    std::fs::write(mp.join("keep.txt"), b"keep these bytes").unwrap();
    assert!(daemon.terminate(SIGTERM_WAIT).success(), "log:\n{}", daemon.log_text());
    drop(daemon);

    let out = scopefs(&config, &["fsck", &scope]);
    assert!(out.status.success(), "fsck of a healthy scope failed:\n{}", text(&out));
    assert!(text(&out).contains("clean"), "{}", text(&out));

    // Delete the victim's block object behind the daemon's back (sha256 names the object; a small
    // one lives in the object directory's pack database, so it goes through the store).
    let sha = hex_sha256(b"victim bytes that will lose their block");
    let store = scopefs::store::LocalDirStore::new(tmp.path().join("data/objects")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let objects = rt.block_on(scopefs::store::ObjectStore::list(&store, "")).unwrap();
    let victim: Vec<_> = objects.iter().filter(|o| o.key.contains(&sha)).collect();
    assert_eq!(victim.len(), 1, "victim block object not found among {objects:?}");
    rt.block_on(scopefs::store::ObjectStore::delete(&store, &victim[0].key)).unwrap();
    drop(store);

    let out = scopefs(&config, &["fsck", &scope]);
    let report = text(&out);
    assert!(!out.status.success(), "fsck passed with a missing block:\n{report}");
    assert!(report.lines().any(|l| l.starts_with("DAMAGED /docs/victim.txt")), "{report}");
    assert!(!report.contains("keep.txt"), "{report}");
    let out = scopefs(&config, &["fsck", &scope, "--repair"]);
    let report = text(&out);
    assert!(!out.status.success(), "--repair hid the damage:\n{report}");
    assert!(report.lines().any(|l| l.starts_with("DAMAGED /docs/victim.txt")), "{report}");

    // Served again: the damaged file's read fails (never other bytes); the healthy file is intact.
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve-2.log", &[]);
    daemon.wait_ready(&client());
    let mp = daemon.mount_root.join(&scope);
    match std::fs::read(mp.join("docs/victim.txt")) {
        Ok(bytes) => panic!("damaged file read returned {} bytes instead of failing", bytes.len()),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
    }
    assert_eq!(std::fs::read(mp.join("keep.txt")).unwrap(), b"keep these bytes");
    assert!(daemon.terminate(SIGTERM_WAIT).success());
}

fn hex_sha256(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// One parsed sample: name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// Parses Prometheus text with the reference Python parser (`prometheus_client`, Debian package
/// python3-prometheus-client) and returns every sample as (name, sorted labels, value).
fn parse_metrics(text: &str) -> Vec<Sample> {
    const PARSER: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append([s.name, sorted(s.labels.items()), s.value])
print(json.dumps(out))
"#;
    let python = "/usr/bin/python3";
    let mut child = Command::new(python)
        .args(["-c", PARSER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 missing: install python3-prometheus-client (scripts/install-deps.sh)");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "/metrics is not valid Prometheus text (or prometheus_client is missing: install \
         python3-prometheus-client):\n{}\n--- text ---\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let labels = s[1]
                .as_array()
                .unwrap()
                .iter()
                .map(|kv| (kv[0].as_str().unwrap().to_owned(), kv[1].as_str().unwrap().to_owned()))
                .collect();
            (s[0].as_str().unwrap().to_owned(), labels, s[2].as_f64().unwrap())
        })
        .collect()
}

/// Value of the sample `name` whose labels include every pair of `labels`.
fn sample(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v)))
        .map(|s| s.2)
        .unwrap_or_else(|| panic!("no sample {name} {labels:?}"))
}

const METRICS_SERVICE_TOKEN: &str = "metrics-test-service-token-0123456789abcdef";

#[test]
fn metrics_parse_as_prometheus_text_and_counters_move() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = local_config(tmp.path(), port);
    // A known service token, for one request through the workspace API.
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("service_token = {METRICS_SERVICE_TOKEN:?}\n{text}")).unwrap();
    let scope = create_scope(&config, "metrics-thread");
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve.log", &[]);
    let http = client();
    daemon.wait_ready(&http);
    // Review L9: the scrape names every scope, so it needs the service token.
    let anonymous = http.get(format!("{}/metrics", daemon.base)).send().unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let fetch = || {
        let resp = http.get(format!("{}/metrics", daemon.base)).bearer_auth(METRICS_SERVICE_TOKEN).send().unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let ct = resp.headers()[reqwest::header::CONTENT_TYPE].to_str().unwrap().to_owned();
        assert!(ct.starts_with("text/plain"), "{ct}");
        parse_metrics(&resp.text().unwrap())
    };
    let before = fetch();
    assert_eq!(sample(&before, "scopefs_scopes", &[("state", "draft")]), 1.0);
    // Mounted but not used yet: its metadata database is not open; its usage is what the database
    // noted when `scope create` (which made it) closed it.
    assert_eq!(sample(&before, "scopefs_open_scope_databases", &[]), 0.0, "an idle scope's database was opened");
    assert_eq!(sample(&before, "scopefs_scope_files", &[("scope_id", &scope)]), 0.0);
    let puts0 = sample(&before, "scopefs_object_store_requests_total", &[("op", "put")]);
    let refused_path0 = sample(&before, "scopefs_refused_total", &[("kind", "path"), ("via", "mount")]);
    let refused_link0 = sample(&before, "scopefs_refused_total", &[("kind", "symlink"), ("via", "mount")]);
    let refused_api0 = sample(&before, "scopefs_refused_total", &[("kind", "path"), ("via", "api")]);

    // Writes through the mount; a reserved name is refused.
    let mp = daemon.mount_root.join(&scope);
    std::fs::write(mp.join("a.txt"), vec![7u8; 100_000]).unwrap();
    std::fs::write(mp.join("b.txt"), b"bee").unwrap();
    assert!(std::fs::write(mp.join(".secrets"), b"x").is_err(), "reserved name accepted");

    let after = fetch();
    assert_eq!(sample(&after, "scopefs_scope_files", &[("scope_id", &scope)]), 2.0);
    assert_eq!(sample(&after, "scopefs_scope_bytes", &[("scope_id", &scope)]), 100_003.0);
    assert!(sample(&after, "scopefs_object_store_requests_total", &[("op", "put")]) >= puts0 + 2.0);
    assert!(sample(&after, "scopefs_fuse_operations_total", &[("op", "write")]) >= 2.0);
    assert!(sample(&after, "scopefs_fuse_operation_seconds_count", &[("op", "write")]) >= 2.0);
    // The scrape sees the shared FUSE pool (nothing is being served now; no mount waited).
    assert!(sample(&after, "scopefs_fuse_workers_busy", &[]) <= 16.0);
    sample(&after, "scopefs_fuse_mount_share_waits_total", &[]);
    assert!(sample(&after, "scopefs_refused_total", &[("kind", "path"), ("via", "mount")]) > refused_path0);
    assert_eq!(sample(&after, "scopefs_refused_total", &[("kind", "path"), ("via", "api")]), refused_api0);
    sample(&after, "scopefs_refused_total", &[("kind", "cross_scope"), ("via", "api")]);
    // Any symlink target is allowed (SPEC §6): an absolute one is no refusal.
    std::os::unix::fs::symlink("/etc/passwd", mp.join("escape")).expect("absolute symlink refused");
    let linked = fetch();
    assert_eq!(sample(&linked, "scopefs_refused_total", &[("kind", "symlink"), ("via", "mount")]), refused_link0);
    // A rename flag scopefs does not support is refused (EINVAL) and counted as unsupported.
    let unsupported = |samples: &[Sample]| {
        samples
            .iter()
            .find(|(n, l, _)| {
                n == "scopefs_fuse_unsupported_total" && l.iter().any(|(k, v)| k == "op" && v == "rename")
            })
            .map_or(0.0, |s| s.2)
    };
    let unsupported0 = unsupported(&linked);
    let path = |name: &str| std::ffi::CString::new(mp.join(name).into_os_string().into_encoded_bytes()).unwrap();
    let (from, to) = (path("b.txt"), path("whiteout.txt"));
    // SAFETY: two valid NUL-terminated paths.
    let r =
        unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::RENAME_WHITEOUT) };
    assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::EINVAL)));
    let counted = fetch();
    assert_eq!(unsupported(&counted), unsupported0 + 1.0);

    // A path the API refuses (400, nothing written) moves the API's counter, not the mounts'.
    let bad = http
        .put(format!("{}/api/workspace/file", daemon.base))
        .query(&[("threadId", "metrics-thread"), ("path", "../escape.txt")])
        .bearer_auth(METRICS_SERVICE_TOKEN)
        .body("x")
        .send()
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let last = fetch();
    assert_eq!(sample(&last, "scopefs_refused_total", &[("kind", "path"), ("via", "api")]), refused_api0 + 1.0);
    assert_eq!(
        sample(&last, "scopefs_refused_total", &[("kind", "path"), ("via", "mount")]),
        sample(&after, "scopefs_refused_total", &[("kind", "path"), ("via", "mount")])
    );
    for name in [
        "scopefs_upload_queue_blocks",
        "scopefs_staging_bytes",
        "scopefs_listing_bytes",
        "scopefs_cache_hits_total",
        "scopefs_environments_running",
        "scopefs_pending_usage",
    ] {
        sample(&after, name, &[]);
    }
    sample(&after, "scopefs_settlements", &[("result", "settled")]);
    // Every [limits] bound has its refusal counter, zeros included.
    for bound in
        ["concurrent_execs", "live_processes", "inflight_per_scope", "path_depth", "listing_bytes", "listing_memory"]
    {
        sample(&after, "scopefs_limit_refused_total", &[("bound", bound)]);
    }
    assert!(daemon.terminate(SIGTERM_WAIT).success());

    // Issue 24 item 8: after a restart the scope's database stays closed until used, and the scrape
    // answers its counts from what the database noted when it closed.
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve2.log", &[]);
    daemon.wait_ready(&http);
    let resp = http.get(format!("{}/metrics", daemon.base)).bearer_auth(METRICS_SERVICE_TOKEN).send().unwrap();
    let restarted = parse_metrics(&resp.text().unwrap());
    assert_eq!(sample(&restarted, "scopefs_open_scope_databases", &[]), 0.0, "nothing opened for the scrape");
    for name in ["scopefs_scope_files", "scopefs_scope_bytes"] {
        let (now, before) =
            (sample(&restarted, name, &[("scope_id", &scope)]), sample(&last, name, &[("scope_id", &scope)]));
        assert_eq!(now, before, "{name}: what the last scrape before the restart said");
    }
    assert!(daemon.terminate(SIGTERM_WAIT).success());
}

fn garage_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: start Garage and export its variables: eval \"$(bash scripts/garage.sh env)\"")
    })
}

/// Runs `doctor` with extra environment; (success, stdout).
fn doctor(config: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("SCOPEFS_DOCTOR_FUSE_DEVICE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.arg("--config").arg(config).arg("doctor").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in stdout.lines() {
        let level = ["PASS ", "WARN ", "FAIL "].iter().any(|p| line.starts_with(p));
        assert!(level, "not a PASS/WARN/FAIL line: {line}\n{stdout}");
    }
    (out.status.success(), stdout)
}

fn has(out: &str, prefix: &str) -> bool {
    out.lines().any(|l| l.starts_with(prefix))
}

#[test]
fn doctor_passes_when_healthy_and_fails_clearly_on_each_broken_prerequisite() {
    let tmp = tempfile::tempdir().unwrap();
    let endpoint = garage_env("SCOPEFS_TEST_S3_ENDPOINT");
    let secret = garage_env("SCOPEFS_TEST_S3_SECRET_ACCESS_KEY");
    let s3 = |secret: &str| {
        format!(
            "data_dir = {data:?}\nmount_root = {mnt:?}\nstore_timeout_ms = 3000\nstore_attempts = 1\n\n[store]\nkind = \"s3\"\n\
             endpoint = {endpoint:?}\nregion = {region:?}\nbucket = {bucket:?}\nprefix = \"doctor-test/\"\n\
             access_key_id = {key:?}\nsecret_access_key = {secret:?}\n\n[executor]\ndocker_host = \"unix:///var/run/docker.sock\"\n",
            data = tmp.path().join("data"),
            mnt = tmp.path().join("mnt"),
            region = garage_env("SCOPEFS_TEST_S3_REGION"),
            bucket = garage_env("SCOPEFS_TEST_S3_BUCKET"),
            key = garage_env("SCOPEFS_TEST_S3_ACCESS_KEY_ID"),
        )
    };
    let config = tmp.path().join("scopefs.toml");
    std::fs::write(&config, s3(&secret)).unwrap();
    let checks =
        ["fuse-device", "mount-permission", "mount-root", "registry", "object-store", "docker-engine", "docker-image"];

    // Healthy: Garage with the right credentials, /dev/fuse, a running Docker engine, the test's
    // sandbox image; the embedded default plan allows no compute, a warning that names the key.
    let image = std::env::var("SCOPEFS_TEST_DOCKER_IMAGE").expect("SCOPEFS_TEST_DOCKER_IMAGE (scripts/docker.sh)");
    let with_image = [("SCOPEFS_EXECUTOR_IMAGE", image.as_str())];
    let (ok, out) = doctor(&config, &with_image);
    assert!(ok, "doctor failed on a healthy setup:\n{out}");
    for check in checks {
        assert!(has(&out, &format!("PASS {check}:")), "no PASS {check}:\n{out}");
    }
    let starter = "WARN billing-plan: new accounts get plan \"starter\", which allows no compute";
    assert!(has(&out, starter) && out.contains("pricing.default_plan"), "{out}");
    // Issue 25 item 6: an image not pulled yet warns (at b9db1d1: `PASS ... is not present`), and
    // a default plan with compute passes, naming what it allows.
    let missing = [("SCOPEFS_EXECUTOR_IMAGE", "scopefs-test:never-built"), ("SCOPEFS_PRICING_DEFAULT_PLAN", "pro")];
    let (ok, out) = doctor(&config, &missing);
    assert!(ok, "a warning is no failure:\n{out}");
    assert!(has(&out, "WARN docker-image: sandbox image scopefs-test:never-built is not present"), "{out}");
    assert!(has(&out, "PASS billing-plan: new accounts get plan \"pro\": compute allowed, 120 free minutes"), "{out}");

    // No FUSE device.
    let (ok, out) = doctor(&config, &[("SCOPEFS_DOCTOR_FUSE_DEVICE", "/dev/no-such-fuse")]);
    assert!(!ok && has(&out, "FAIL fuse-device: /dev/no-such-fuse does not exist"), "{out}");
    assert!(has(&out, "PASS object-store:"), "{out}");

    // Bad S3 credentials against the real server.
    std::fs::write(&config, s3("wrong-secret-0000000000000000000000000000")).unwrap();
    let (ok, out) = doctor(&config, &[]);
    assert!(!ok && has(&out, "FAIL object-store: put/get/delete probe failed"), "{out}");
    assert!(!out.contains("wrong-secret") && !out.contains(&secret), "doctor printed a secret:\n{out}");
    assert!(has(&out, "PASS fuse-device:"), "{out}");

    // Unreachable Docker engine.
    std::fs::write(&config, s3(&secret)).unwrap();
    let dead = tmp.path().join("no-docker.sock");
    let (ok, out) = doctor(&config, &[("SCOPEFS_EXECUTOR_DOCKER_HOST", dead.to_str().unwrap())]);
    assert!(!ok && has(&out, "FAIL docker-engine: Docker engine unreachable"), "{out}");
    assert!(has(&out, "PASS object-store:"), "{out}");
}

#[test]
fn token_show_rotate_import_and_gc() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = local_config(tmp.path(), port);

    // token show generates once and is stable; rotate replaces it (0600 file) and prints the new one.
    let show = |kind: &str| {
        let out = scopefs(&config, &["token", "show", kind]);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let first = show("service");
    assert_eq!(first.len(), 64);
    assert_eq!(show("service"), first);
    assert_ne!(show("admin"), first);
    let out = scopefs(&config, &["token", "rotate", "service"]);
    assert!(out.status.success(), "{}", text(&out));
    let rotated = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_ne!(rotated, first);
    assert_eq!(show("service"), rotated);
    let file = tmp.path().join("data/control/service-token");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);

    // import: a tree lands in the thread's scope, with a progress bar on stderr.
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    std::fs::write(src.join("top.txt"), b"top").unwrap();
    std::fs::write(src.join("a/b/deep.bin"), vec![3u8; 300_000]).unwrap();
    let out = scopefs(&config, &["import", src.to_str().unwrap(), "--thread", "import-thread"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("2/2 files"), "{}", text(&out));
    let listing = String::from_utf8_lossy(&scopefs(&config, &["scope", "ls"]).stdout).into_owned();
    let row = listing.lines().find(|l| l.ends_with("import-thread")).unwrap_or_else(|| panic!("{listing}"));
    let scope = row.split_whitespace().next().unwrap().to_owned();

    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve.log", &[]);
    daemon.wait_ready(&client());
    let mp = daemon.mount_root.join(&scope);
    assert_eq!(std::fs::read(mp.join("top.txt")).unwrap(), b"top");
    assert_eq!(std::fs::read(mp.join("a/b/deep.bin")).unwrap(), vec![3u8; 300_000]);
    std::fs::remove_file(mp.join("a/b/deep.bin")).unwrap();
    assert!(daemon.terminate(SIGTERM_WAIT).success());
    drop(daemon);

    // gc deletes the unreferenced block; fsck is clean afterwards.
    let out = scopefs(&config, &["gc", &scope]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("1 blocks deleted"), "{}", text(&out));
    let out = scopefs(&config, &["fsck", &scope]);
    assert!(out.status.success(), "{}", text(&out));
}

/// What an offline command prints while a daemon holds the data directory's lock.
const DAEMON_RUNNING: &str = "a scopefs daemon is running on this data directory; stop it first";

/// Runs a second `scopefs serve` with `config` until it exits (at most 60 s): (success, stderr).
fn second_serve(config: &Path) -> (bool, String) {
    let mut child = Command::new(BIN)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("SCOPEFS_SERVICE_TOKEN")
        .arg("--config")
        .arg(config)
        .arg("serve")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting a second scopefs serve");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a second daemon on the same data directory kept running");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status.success(), err)
}

/// Review D8: while a daemon runs (its supervisor holds the data directory's lock, shared with each
/// worker it starts), the offline commands that would open its scopes, store or registry refuse
/// and change nothing, a second daemon on the same data directory refuses to start, and once the
/// daemon stopped the same commands run.
#[test]
fn offline_commands_and_a_second_daemon_refuse_while_a_daemon_runs() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = local_config(tmp.path(), port);
    let scope = create_scope(&config, "locked-thread");
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve.log", &[]);
    let http = client();
    daemon.wait_ready(&http);
    let mp = daemon.mount_root.join(&scope);
    std::fs::write(mp.join("gone.txt"), b"bytes only gc may delete").unwrap();
    std::fs::write(mp.join("keep.txt"), b"keep these").unwrap();
    std::fs::remove_file(mp.join("gone.txt")).unwrap();
    // A file open for writing while the commands are tried (its working file must stay).
    let mut open = std::fs::File::create(mp.join("open.txt")).unwrap();
    open.write_all(b"first half, ").unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a.txt"), b"imported").unwrap();
    let refused = |args: &[&str]| {
        let out = scopefs(&config, args);
        assert!(!out.status.success(), "{args:?} ran beside the daemon:\n{}", text(&out));
        assert!(text(&out).contains(DAEMON_RUNNING), "{args:?}: no clear refusal:\n{}", text(&out));
    };
    let offline: [&[&str]; 5] = [
        &["fsck", &scope],
        &["fsck", &scope, "--repair"],
        &["gc", &scope],
        &["import", src.to_str().unwrap(), "--thread", "other-thread"],
        &["scope", "create", "--thread", "other-thread"],
    ];
    for args in offline {
        refused(args);
    }
    // The daemon's open file was left alone.
    open.write_all(b"second half").unwrap();
    drop(open);
    assert_eq!(std::fs::read(mp.join("open.txt")).unwrap(), b"first half, second half");
    // A killed worker is replaced under the same lock: still refused.
    let worker = daemon.pid();
    // SAFETY: kill(2) on the supervisor's child, which this test started.
    assert_eq!(unsafe { libc::kill(worker as i32, libc::SIGKILL) }, 0);
    daemon.worker(Some(worker));
    daemon.wait_ready(&http);
    refused(&["gc", &scope]);
    // A second daemon on the same data directory (another port and mount root) refuses at start.
    let second = tmp.path().join("second.toml");
    std::fs::write(
        &second,
        format!(
            "data_dir = {:?}\nmount_root = {:?}\nlisten = \"127.0.0.1:{}\"\n\n[store]\nkind = \"local\"\n",
            tmp.path().join("data"),
            tmp.path().join("mnt2"),
            free_port()
        ),
    )
    .unwrap();
    let (ok, err) = second_serve(&second);
    serve_process::detach_mounts_under(&tmp.path().join("mnt2"));
    assert!(!ok && err.contains(DAEMON_RUNNING), "the second daemon did not refuse:\n{err}");
    // `scope ls` only reads the registry: it works beside the daemon, and nothing was created.
    let out = scopefs(&config, &["scope", "ls"]);
    assert!(out.status.success() && !text(&out).contains("other-thread"), "{}", text(&out));
    assert!(daemon.terminate(SIGTERM_WAIT).success(), "log:\n{}", daemon.log_text());
    drop(daemon);

    // Stopped: the refused gc deleted nothing (the removed file's block is still stored), this
    // one deletes it; fsck is clean.
    let gone = hex_sha256(b"bytes only gc may delete");
    let stored = |sha: &str| {
        let store = scopefs::store::LocalDirStore::new(tmp.path().join("data/objects")).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(scopefs::store::ObjectStore::list(&store, "")).unwrap().iter().any(|o| o.key.ends_with(sha))
    };
    assert!(stored(&gone), "the removed file's block was deleted while the daemon ran");
    let out = scopefs(&config, &["gc", &scope]);
    assert!(out.status.success() && text(&out).contains("blocks deleted"), "{}", text(&out));
    assert!(!stored(&gone), "gc did not delete the removed file's block:\n{}", text(&out));
    let out = scopefs(&config, &["fsck", &scope]);
    assert!(out.status.success() && text(&out).contains("clean"), "{}", text(&out));
}
