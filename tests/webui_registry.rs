//! WebUI registry API against the real daemon: provision/owners/revisions (a), run reservations (b),
//! cutover leases (c), delete with drain, draft expiry and purge from Garage (f), crash recovery with
//! failpoints (g), and the token check of every route plus `/openapi.json` = router (h).
//!
//! Needs root and /dev/fuse; the purge test needs Garage (`eval "$(bash scripts/garage.sh env)"`).

pub mod serve_process;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::blocking::{Client, RequestBuilder};
use reqwest::StatusCode;
use scopefs::store::{ObjectStore, S3Settings, S3Store};
use serde_json::{json, Value};
use serve_process::{free_port, mounts_under, write_config, ServeProcess};

const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;

fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: start Garage and run `eval \"$(bash scripts/garage.sh env)\"` first")
    })
}

/// A test daemon's files and settings; `start` runs `scopefs serve` on them.
struct Setup {
    dir: tempfile::TempDir,
    port: u16,
    /// Extra TOML appended to the config (e.g. a `[store]` table).
    store_toml: String,
    clock_file: PathBuf,
}

impl Setup {
    fn local() -> Setup {
        Self::with_store("[store]\nkind = \"local\"\n".into())
    }

    fn with_store(store_toml: String) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let clock_file = dir.path().join("clock-offset");
        Setup { port: free_port(), dir, store_toml, clock_file }
    }

    fn config(&self) -> PathBuf {
        let rest =
            format!("fuse.attr_ttl_ms = 0\ndraft_ttl_hours = 24\ntrash_retention_days = 7\n\n{}", self.store_toml);
        write_config(self.dir.path(), self.port, &rest)
    }

    /// Moves the daemon's registry clock `secs` ahead of the real time.
    fn set_clock_offset(&self, secs: i64) {
        std::fs::write(&self.clock_file, secs.to_string()).unwrap();
    }

    fn start(&self, failpoint: Option<&str>) -> Daemon {
        let env: Vec<(&str, &str)> = failpoint.map(|fp| ("SCOPEFS_FAILPOINT", fp)).into_iter().collect();
        self.start_with(&env)
    }

    /// The process, with `extra` variables, not waited for.
    fn spawn(&self, extra: &[(&str, &str)]) -> ServeProcess {
        let mut env = vec![
            ("SCOPEFS_TEST_CLOCK_FILE", self.clock_file.to_str().unwrap()),
            ("SCOPEFS_DELETE_DRAIN_SECS", "2"),
            ("SCOPEFS_MAINTENANCE_INTERVAL_SECS", "1"),
        ];
        env.extend_from_slice(extra);
        let log_name = format!("serve-{}.log", uuid::Uuid::now_v7());
        ServeProcess::start(self.dir.path(), &self.config(), self.port, &log_name, &env)
    }

    fn start_with(&self, extra: &[(&str, &str)]) -> Daemon {
        let mut d = Daemon {
            serve: self.spawn(extra),
            http: Client::builder().timeout(Duration::from_secs(60)).build().unwrap(),
            token: String::new(),
        };
        d.serve.wait_ready(&d.http);
        d.token = std::fs::read_to_string(self.dir.path().join("data/control/service-token")).unwrap().trim().into();
        d
    }
}

/// A running `scopefs serve` with its client and service token (the process: [`ServeProcess`]).
struct Daemon {
    serve: ServeProcess,
    http: Client,
    token: String,
}

impl Daemon {
    /// Waits for the daemon to die by itself (a failpoint aborted it).
    fn wait_aborted(&mut self) {
        let status = self.serve.wait_exit(Duration::from_secs(30));
        assert!(!status.success(), "the daemon exited cleanly instead of aborting");
    }

    fn req(&self, method: &str, path: &str) -> RequestBuilder {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        self.http.request(m, format!("{}{path}", self.serve.base)).bearer_auth(&self.token)
    }

    /// Provisions `thread` as a new conversation (`new_thread`, as a BFF creating one does).
    fn provision(&self, op: &str, thread: &str) -> (StatusCode, Value) {
        call(
            self.req("POST", "/internal/workspace-scopes/provision")
                .json(&json!({"operation_id": op, "primary_thread_id": thread, "new_thread": true})),
        )
    }

    /// Provisions `thread` and returns its scope view.
    fn draft(&self, thread: &str) -> Value {
        let (status, body) = self.provision(&format!("op-{thread}"), thread);
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body
    }

    fn by_thread(&self, thread: &str) -> (StatusCode, Value) {
        call(self.req("GET", &format!("/internal/workspace-scopes/by-thread/{thread}")))
    }

    fn patch_scope(&self, scope: &str, rev: &Value, state: &str) -> (StatusCode, Value) {
        call(
            self.req("PATCH", &format!("/internal/workspace-scopes/{scope}"))
                .json(&json!({"expected_revision": rev, "state": state})),
        )
    }

    fn new_owner(&self, scope: &str, body: Value) -> (StatusCode, Value) {
        call(self.req("POST", &format!("/internal/workspace-scopes/{scope}/owners")).json(&body))
    }

    fn patch_owner(&self, scope: &str, owner: &str, body: Value) -> (StatusCode, Value) {
        call(self.req("PATCH", &format!("/internal/workspace-scopes/{scope}/owners/{owner}")).json(&body))
    }

    fn reserve(&self, scope: &str, body: Value) -> (StatusCode, Value) {
        call(self.req("POST", &format!("/internal/workspace-scopes/{scope}/runs/reserve")).json(&body))
    }

    fn mountpoint(&self, scope: &str) -> PathBuf {
        self.serve.mount_root.join(scope)
    }

    /// Polls `by-thread` until `pred` holds (bounded).
    fn wait_scope(&self, thread: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, body) = self.by_thread(thread);
            if pred(&body) {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "scope of {thread} never became {what}: {body}\nlog:\n{}",
                self.serve.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `scopefs_maintenance_passes_total` from `/metrics`.
    fn maintenance_passes(&self) -> u64 {
        let resp = self.req("GET", "/metrics").send().expect("GET /metrics failed");
        assert_eq!(resp.status(), StatusCode::OK, "GET /metrics");
        let text = resp.text().unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("scopefs_maintenance_passes_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no scopefs_maintenance_passes_total sample in /metrics:\n{text}"))
    }

    /// Waits (bounded) until the daemon's log contains `needle`.
    fn wait_log(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.serve.log_text().contains(needle) {
            assert!(Instant::now() < deadline, "the log never said {needle:?}:\n{}", self.serve.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (bounded) until `n` more periodic maintenance passes than `since` have finished.
    fn wait_passes(&self, since: u64, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.maintenance_passes() < since + n {
            assert!(
                Instant::now() < deadline,
                "{n} maintenance passes did not finish\nlog:\n{}",
                self.serve.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn is_mounted(mp: &Path) -> bool {
    mounts_under(mp).iter().any(|m| Path::new(m) == mp)
}

fn call(req: RequestBuilder) -> (StatusCode, Value) {
    let resp = req.send().expect("request failed");
    let status = resp.status();
    let text = resp.text().unwrap();
    let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("non-JSON body ({e}): {text}"));
    (status, body)
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_else(|| panic!("not an error body: {body}"))
}

fn s(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_else(|| panic!("no string {key} in {v}")).to_owned()
}

#[test]
fn provision_owners_and_revisions() {
    let setup = Setup::local();
    let d = setup.start(None);
    // Provision: idempotent on operation_id, one scope per thread.
    let a = d.draft("thread-a");
    let scope_a = s(&a, "scope_id");
    let (st, again) = d.provision("op-thread-a", "thread-a");
    assert_eq!((st, s(&again, "scope_id"), again["created"].as_bool()), (StatusCode::OK, scope_a.clone(), Some(false)));
    let (st, other_op) = d.provision("op-other", "thread-a");
    assert_eq!((st, s(&other_op, "scope_id")), (StatusCode::OK, scope_a.clone()));
    let (st, body) = d.provision("op-thread-a", "thread-z");
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "idempotency_key_conflict"));
    let b = d.draft("thread-b");
    let scope_b = s(&b, "scope_id");
    assert_ne!(scope_a, scope_b);

    // Revision CAS on the scope: stale → 409, right → activation; deleted cannot be requested.
    let (st, body) = d.patch_scope(&scope_a, &json!(a["revision"].as_u64().unwrap() + 3), "active");
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "revision_conflict"));
    let (st, act) = d.patch_scope(&scope_a, &a["revision"], "active");
    assert_eq!((st, s(&act, "state")), (StatusCode::OK, "active".to_string()), "{act}");
    assert_eq!(act["revision"].as_u64(), Some(a["revision"].as_u64().unwrap() + 1));
    let (st, body) = d.patch_scope(&scope_a, &a["revision"], "active");
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "revision_conflict"));
    let (st, body) = d.patch_scope(&scope_a, &act["revision"], "deleted");
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "invalid_state_transition"));
    let (st, body) = d.patch_scope(&scope_a, &act["revision"], "draft");
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "invalid_state_transition"));

    // Owners: reserved → attach resource + active → terminal; never active again.
    let (st, o) = d.new_owner(&scope_a, json!({"owner_type": "async_thread"}));
    assert_eq!((st, s(&o, "state")), (StatusCode::CREATED, "reserved".to_string()), "{o}");
    let oid = s(&o, "owner_id");
    let (st, body) = d.patch_owner(&scope_a, &oid, json!({"expected_revision": 9, "state": "active"}));
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "revision_conflict"));
    let (st, o2) =
        d.patch_owner(&scope_a, &oid, json!({"expected_revision": 1, "resource_id": "child-1", "state": "active"}));
    assert_eq!(
        (st, s(&o2, "state"), s(&o2, "resource_id")),
        (StatusCode::OK, "active".into(), "child-1".into()),
        "{o2}"
    );
    let (st, found) = call(d.req("GET", &format!("/internal/workspace-scopes/{scope_a}/owners/by-resource/child-1")));
    assert_eq!((st, s(&found, "owner_id")), (StatusCode::OK, oid.clone()));
    let (st, body) = call(d.req("GET", &format!("/internal/workspace-scopes/{scope_b}/owners/by-resource/child-1")));
    assert_eq!((st, code(&body)), (StatusCode::NOT_FOUND, "owner_not_found"), "another scope's owner is invisible");
    for terminal in ["terminal", "quarantined"] {
        let (_, o) = d.new_owner(&scope_a, json!({"owner_type": "cron"}));
        let id = s(&o, "owner_id");
        let (st, _) = d.patch_owner(&scope_a, &id, json!({"state": "active"}));
        assert_eq!(st, StatusCode::OK);
        let (st, t) = d.patch_owner(&scope_a, &id, json!({"state": terminal}));
        assert_eq!((st, s(&t, "state")), (StatusCode::OK, terminal.to_string()));
        let (st, body) = d.patch_owner(&scope_a, &id, json!({"state": "active"}));
        assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "invalid_state_transition"), "{terminal} → active");
    }
    // A resource owned in one scope cannot be registered in another.
    let (st, body) = d.new_owner(&scope_b, json!({"owner_type": "async_thread", "resource_id": "child-1"}));
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "resource_already_owned"));
    let (_, ob) = d.new_owner(&scope_b, json!({"owner_type": "async_thread"}));
    let (st, body) = d.patch_owner(&scope_b, &s(&ob, "owner_id"), json!({"resource_id": "child-1"}));
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "resource_already_owned"));
    // Bad input.
    let (st, body) = d.new_owner(&scope_b, json!({"owner_type": "martian"}));
    assert_eq!((st, code(&body)), (StatusCode::BAD_REQUEST, "invalid_json"));
    let (st, body) = d.new_owner("not-a-uuid", json!({"owner_type": "cron"}));
    assert_eq!((st, code(&body)), (StatusCode::BAD_REQUEST, "invalid_scope_id"));
    let (st, body) = d.new_owner(&uuid::Uuid::now_v7().to_string(), json!({"owner_type": "cron"}));
    assert_eq!((st, code(&body)), (StatusCode::NOT_FOUND, "scope_not_found"));
}

#[test]
fn run_reservations() {
    let setup = Setup::local();
    let d = setup.start(None);
    let sc = d.draft("thread-r");
    let scope = s(&sc, "scope_id");
    let r = |id: &str, turn: &str, int: Option<&str>, hash: &str| {
        d.reserve(&scope, json!({"run_request_id": id, "turn_id": turn, "interrupt_key": int, "request_hash": hash}))
    };
    let (st, r1) = r("rr-1", "turn-1", None, "h1");
    assert_eq!(st, StatusCode::CREATED, "{r1}");
    assert_eq!(
        (s(&r1, "state"), s(&r1, "scope_state")),
        ("reserved".into(), "active".into()),
        "first reservation activates"
    );
    assert_eq!(s(&d.by_thread("thread-r").1, "state"), "active");
    let (st, again) = r("rr-1", "turn-1", None, "h1");
    assert_eq!(
        (st, s(&again, "run_owner_id")),
        (StatusCode::OK, s(&r1, "run_owner_id")),
        "same id + hash: same reservation"
    );
    let (st, body) = r("rr-1", "turn-1", None, "h-other");
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "idempotency_key_conflict"));
    let (st, r2) = r("rr-2", "turn-1", Some("interrupt-1"), "h2");
    assert_eq!(st, StatusCode::CREATED, "same turn, new run_request_id: a new reservation: {r2}");
    assert_ne!(s(&r2, "run_owner_id"), s(&r1, "run_owner_id"));
    let (st, body) = r("rr-3", "turn-1", Some("interrupt-1"), "h3");
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "interrupt_already_resolved"));
    // Attach run ids and finish the runs.
    for (id, run) in [("rr-1", "run-1"), ("rr-2", "run-2")] {
        let path = format!("/internal/workspace-scopes/{scope}/runs/{id}");
        let (st, b) = call(d.req("PATCH", &path).json(&json!({"run_id": run, "state": "started"})));
        assert_eq!((st, s(&b, "run_id"), s(&b, "state")), (StatusCode::OK, run.into(), "started".into()), "{b}");
        let (st, b) = call(d.req("PATCH", &path).json(&json!({"state": "completed"})));
        assert_eq!((st, s(&b, "state")), (StatusCode::OK, "completed".into()));
    }
    let (st, owner) = call(d.req("GET", &format!("/internal/workspace-scopes/{scope}/owners/by-resource/run-1")));
    assert_eq!((st, s(&owner, "state"), s(&owner, "owner_type")), (StatusCode::OK, "terminal".into(), "run".into()));
    // None while the scope is deleting (a live owner keeps it deleting).
    let (_, bg) = d.new_owner(&scope, json!({"owner_type": "background_process"}));
    d.patch_owner(&scope, &s(&bg, "owner_id"), json!({"state": "active"}));
    let cur = d.by_thread("thread-r").1;
    let (st, del) = d.patch_scope(&scope, &cur["revision"], "deleting");
    assert_eq!((st, s(&del, "state")), (StatusCode::OK, "deleting".into()), "{del}");
    let (st, body) = r("rr-9", "turn-2", None, "h9");
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "scope_deleting"));
    let (st, body) = d.new_owner(&scope, json!({"owner_type": "cron"}));
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "scope_deleting"));
}

#[test]
fn cutover_lease_blocks_creation() {
    let setup = Setup::local();
    let d = setup.start(None);
    let sc = d.draft("thread-c");
    let scope = s(&sc, "scope_id");
    let lease = |m: &str, op: &str, ttl: u64| {
        call(d.req(m, "/internal/leases/workspace-cutover").json(&json!({"operation_id": op, "ttl_seconds": ttl})))
    };
    let (st, l) = lease("POST", "cut-1", 2);
    assert_eq!((st, s(&l, "operation_id")), (StatusCode::OK, "cut-1".into()), "{l}");
    let (st, body) = lease("POST", "cut-2", 60);
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "lease_held"));
    let (st, body) = lease("PATCH", "cut-2", 60);
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "lease_not_held"), "renewal by another operation");
    let (st, body) = d.provision("op-new", "thread-new");
    assert_eq!((st, code(&body)), (StatusCode::SERVICE_UNAVAILABLE, "cutover-in-progress"));
    let (st, body) = d.new_owner(&scope, json!({"owner_type": "cron"}));
    assert_eq!((st, code(&body)), (StatusCode::SERVICE_UNAVAILABLE, "cutover-in-progress"));
    let (st, body) = d.reserve(&scope, json!({"run_request_id": "rr", "turn_id": "t", "request_hash": "h"}));
    assert_eq!((st, code(&body)), (StatusCode::SERVICE_UNAVAILABLE, "cutover-in-progress"));
    assert_eq!(d.by_thread("thread-new").0, StatusCode::NOT_FOUND, "nothing was created");
    // The holder renews; after expiry another operation takes it and the holder cannot renew.
    let (st, _) = lease("PATCH", "cut-1", 2);
    assert_eq!(st, StatusCode::OK);
    setup.set_clock_offset(3); // the 2 s lease has expired on the registry clock
    let (st, body) = lease("PATCH", "cut-1", 60);
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "lease_not_held"), "an expired lease is not renewed");
    let (st, l) = lease("POST", "cut-2", 60);
    assert_eq!((st, s(&l, "operation_id")), (StatusCode::OK, "cut-2".into()), "an expired lease can be taken");
    let (st, body) = call(d.req("DELETE", "/internal/leases/workspace-cutover?operation_id=cut-1"));
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "lease_not_held"));
    let (st, body) = call(d.req("DELETE", "/internal/leases/workspace-cutover?operation_id=cut-2"));
    assert_eq!((st, body), (StatusCode::OK, json!({"released": true})));
    let (st, _) = d.provision("op-new", "thread-new");
    assert_eq!(st, StatusCode::CREATED, "creation works again once released");
}

/// A report of the cutover `op` with `status`, for this test deployment, its gates passed (seed
/// 000 §11.1: equal counts, nothing unhandled or inconsistent, the static gate passed).
fn cutover_report(op: &str, status: &str) -> String {
    json!({"operation_id": op, "deployment_id": "default", "status": status,
           "counts": {"threads": 3, "scopes": 3, "primary_owners": 3},
           "unhandled_legacy_owners": 0, "inconsistencies": 0, "static_gate": "passed"})
    .to_string()
}

/// A daemon setup with `cutover.mode = "required"` whose cutover has run as seed 000 §11.1 runs it:
/// in mode `off`, ending with its passed report `cut-0` recorded. Returns the report's path (a
/// directory the caller keeps) for tests that change it.
fn required_cutover_setup() -> (tempfile::TempDir, PathBuf, Setup) {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("latest.json");
    std::fs::write(&report, cutover_report("cut-0", "passed")).unwrap();
    let store =
        format!("[store]\nkind = \"local\"\n\n[cutover]\nmode = \"required\"\nreport = \"{}\"\n", report.display());
    let setup = Setup::with_store(store);
    let mut d = setup.start_with(&[("SCOPEFS_CUTOVER_MODE", "off")]);
    let (st, op) = call(d.req("POST", "/internal/workspace-cutover/report"));
    assert_eq!((st, s(&op, "operation_id")), (StatusCode::OK, "cut-0".into()), "{op}");
    d.serve.stop(Duration::from_secs(30));
    (dir, report, setup)
}

/// Seed 000 §11.1: in mode `required` the daemon starts only while the configured report is a
/// passed one of this deployment matching the newest recorded cutover; otherwise it refuses to
/// start and says why (at 2351eb5 it started and opened the gate on the report's word alone).
#[test]
fn required_mode_starts_only_while_its_report_checks_out() {
    let (_dir, report, setup) = required_cutover_setup();
    let mut d = setup.start(None);
    d.serve.stop(Duration::from_secs(30));
    for (why, text) in [
        ("another cutover's report, never recorded", cutover_report("cut-1", "passed")),
        ("the recorded cutover's report, failed", cutover_report("cut-0", "failed")),
    ] {
        std::fs::write(&report, text).unwrap();
        let mut serve = setup.spawn(&[]);
        let status = serve.wait_exit(Duration::from_secs(60));
        assert!(!status.success(), "{why}: the daemon started");
        assert!(serve.log_text().contains("cutover.mode is \"required\""), "{why}: {}", serve.log_text());
    }
}

/// Issue 24, item 3 (seed 000 §11.1): the cutover works under its own lease. The holder of
/// `workspace-cutover` (naming its `operation_id` as `lease_operation_id`) provisions the threads it
/// migrates, past the required-mode gate it is about to open, and registers their owners; every
/// other caller is still refused (the closed gate's 409 first, the lease's 503 `cutover-in-progress`
/// for owners; at 2351eb5 the holder got 503 too).
#[test]
fn the_cutover_holder_provisions_under_its_own_lease() {
    let (_dir, report, setup) = required_cutover_setup();
    let d = setup.start(None);
    // The cutover runs again (its report changed, not recorded yet): the gate is closed.
    std::fs::write(&report, cutover_report("cut-9", "passed")).unwrap();
    let lease = json!({"operation_id": "cut-9", "ttl_seconds": 600});
    assert_eq!(call(d.req("POST", "/internal/leases/workspace-cutover").json(&lease)).0, StatusCode::OK);
    let provision = |op: &str, thread: &str, holder: Option<&str>| {
        let body = json!({"operation_id": op, "primary_thread_id": thread, "lease_operation_id": holder});
        call(d.req("POST", "/internal/workspace-scopes/provision").json(&body))
    };
    // Anyone else is refused (the closed gate answers first, the lease would next) and nothing is made.
    for holder in [None, Some("someone-else")] {
        let (st, body) = provision("op-l1", "thread-legacy-1", holder);
        assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "migration-required"), "{holder:?}: {body}");
    }
    assert_eq!(d.by_thread("thread-legacy-1").0, StatusCode::NOT_FOUND);
    let (st, sc) = provision("op-l1", "thread-legacy-1", Some("cut-9"));
    assert_eq!(st, StatusCode::CREATED, "the holder provisions under its lease: {sc}");
    let scope = s(&sc, "scope_id");
    let (st, body) = d.new_owner(&scope, json!({"owner_type": "cron", "resource_id": "cron-l1"}));
    assert_eq!((st, code(&body)), (StatusCode::SERVICE_UNAVAILABLE, "cutover-in-progress"), "{body}");
    let owner = json!({"owner_type": "cron", "resource_id": "cron-l1", "lease_operation_id": "cut-9"});
    let (st, body) = d.new_owner(&scope, owner);
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let (st, body) = call(d.req("DELETE", "/internal/leases/workspace-cutover?operation_id=cut-9"));
    assert_eq!((st, body), (StatusCode::OK, json!({"released": true})));
    // Without the lease, the gate is closed again for a thread the cutover did not migrate.
    let (st, body) = provision("op-l2", "thread-missed", Some("cut-9"));
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "migration-required"), "{body}");
    assert_eq!(provision("op-l1", "thread-legacy-1", None).0, StatusCode::OK, "the migrated thread has its scope");
}

/// One sample of `/metrics` (0 when absent would hide a missing family: it panics instead).
fn metric(d: &Daemon, name: &str) -> u64 {
    let text = d.req("GET", "/metrics").send().expect("GET /metrics failed").text().unwrap();
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} sample in /metrics:\n{text}"))
}

/// Seed 000 §11.1: in cutover mode `required` a new thread is 409 `migration-required` until the
/// passed report is recorded (its SHA-256 in a deployment-level operation); the maintenance pass
/// skips (and counts) while an operator holds the `maintenance` lease, and works once released;
/// seed 000 §17's consistency metrics are served.
#[test]
fn required_cutover_gate_and_the_shared_maintenance_lease() {
    let (_dir, report, setup) = required_cutover_setup();
    let d = setup.start(None);
    // A cutover that has to run again (its report changed, and failed): new threads wait for it.
    std::fs::write(&report, cutover_report("cut-1", "failed")).unwrap();
    let (st, body) = d.provision("op-1", "thread-legacy");
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "migration-required"), "{body}");
    let record = || call(d.req("POST", "/internal/workspace-cutover/report"));
    let (st, body) = record();
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "migration-required"), "not passed: {body}");
    // A passed status does not open the gate by itself: each of the report's gates is checked
    // (issue 24 item 3; at 2351eb5 the status alone decided).
    let passed: Value = serde_json::from_str(&cutover_report("cut-1", "passed")).unwrap();
    for (key, bad) in [
        ("counts", json!({"threads": 3, "scopes": 2, "primary_owners": 3})),
        ("unhandled_legacy_owners", json!(1)),
        ("inconsistencies", json!(2)),
        ("static_gate", json!("failed")),
        ("counts", Value::Null),
    ] {
        let mut r = passed.clone();
        r[key] = bad;
        std::fs::write(&report, r.to_string()).unwrap();
        let (st, body) = record();
        assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "migration-required"), "{key}: {body}");
    }
    std::fs::write(&report, cutover_report("cut-1", "passed")).unwrap();
    let (st, op) = record();
    assert_eq!((st, s(&op, "operation_id"), s(&op, "state")), (StatusCode::OK, "cut-1".into(), "completed".into()));
    assert_eq!(s(&op, "result_sha256").len(), 64);
    let sc = d.draft("thread-legacy");
    assert_eq!(s(&sc, "state"), "draft");
    // Open gate: a thread that is not a new conversation and has no scope is one the cutover
    // missed, still 409 (at b9db1d1 the open gate provisioned any unknown thread).
    let historical = json!({"operation_id": "op-h", "primary_thread_id": "thread-missed"});
    let (st, body) = call(d.req("POST", "/internal/workspace-scopes/provision").json(&historical));
    assert_eq!((st, code(&body)), (StatusCode::CONFLICT, "migration-required"), "{body}");
    assert_eq!(d.by_thread("thread-missed").0, StatusCode::NOT_FOUND);
    // Served (`metric` panics on a missing sample).
    metric(&d, "scopefs_runs_without_scope_total");
    metric(&d, "scopefs_metadata_mismatch_total");
    assert_eq!(metric(&d, "scopefs_orphan_directories"), 0);

    // A delete blocked by a cron that never started, while an operator holds the maintenance
    // lease: passes skip (counted); once released, a pass compensates the cron and the delete ends.
    let scope = s(&sc, "scope_id");
    let (st, cron) = d.new_owner(&scope, json!({"owner_type": "cron", "resource_id": "cron-1"}));
    assert_eq!(st, StatusCode::CREATED, "{cron}");
    let lease = json!({"operation_id": "operator-1", "ttl_seconds": 3600});
    assert_eq!(call(d.req("POST", "/internal/leases/maintenance").json(&lease)).0, StatusCode::OK);
    let (st, body) = d.patch_scope(&scope, &sc["revision"], "deleting");
    assert_eq!((st, s(&body, "state")), (StatusCode::OK, "deleting".into()), "{body}");
    let (skipped, passes) = (metric(&d, "scopefs_maintenance_skipped_total"), d.maintenance_passes());
    d.wait_passes(passes, 2);
    assert!(metric(&d, "scopefs_maintenance_skipped_total") > skipped);
    assert_eq!(s(&d.by_thread("thread-legacy").1, "state"), "deleting", "no work under an operator's lease");
    let (st, _) = call(d.req("DELETE", "/internal/leases/maintenance?operation_id=operator-1"));
    assert_eq!(st, StatusCode::OK);
    let passes = d.maintenance_passes();
    d.wait_passes(passes, 2);
    assert_eq!(s(&d.by_thread("thread-legacy").1, "state"), "deleted", "the cron was compensated");
    let (st, owner) = call(d.req("GET", &format!("/internal/workspace-scopes/{scope}/owners/by-resource/cron-1")));
    assert_eq!((st, s(&owner, "state")), (StatusCode::OK, "terminal".into()), "{owner}");
}

/// The S3 store config of the test bucket under a fresh prefix, and a client of the same place.
fn garage(prefix: &str) -> (String, Arc<dyn ObjectStore>) {
    let toml = format!(
        "[store]\nkind = \"s3\"\nendpoint = {e:?}\nregion = {r:?}\nbucket = {b:?}\nprefix = {p:?}\npath_style = true\n\
         access_key_id = {k:?}\nsecret_access_key = {sk:?}\n",
        e = required_env("SCOPEFS_TEST_S3_ENDPOINT"),
        r = required_env("SCOPEFS_TEST_S3_REGION"),
        b = required_env("SCOPEFS_TEST_S3_BUCKET"),
        p = prefix,
        k = required_env("SCOPEFS_TEST_S3_ACCESS_KEY_ID"),
        sk = required_env("SCOPEFS_TEST_S3_SECRET_ACCESS_KEY"),
    );
    let settings = S3Settings {
        endpoint: Some(required_env("SCOPEFS_TEST_S3_ENDPOINT")),
        region: required_env("SCOPEFS_TEST_S3_REGION"),
        bucket: required_env("SCOPEFS_TEST_S3_BUCKET"),
        prefix: prefix.to_owned(),
        path_style: true,
        access_key_id: Some(required_env("SCOPEFS_TEST_S3_ACCESS_KEY_ID")),
        secret_access_key: Some(required_env("SCOPEFS_TEST_S3_SECRET_ACCESS_KEY")),
    };
    (toml, Arc::new(S3Store::new(settings).expect("S3 store for Garage")))
}

fn object_count(rt: &tokio::runtime::Runtime, store: &Arc<dyn ObjectStore>, scope: &str) -> usize {
    rt.block_on(store.list(&format!("scopes/{scope}/"))).expect("listing Garage").len()
}

#[test]
fn delete_drain_draft_expiry_and_purge_from_garage() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let prefix = format!("webui-registry/{}", uuid::Uuid::now_v7());
    let (toml, store) = garage(&prefix);
    let setup = Setup::with_store(toml);
    setup.set_clock_offset(0);
    let d = setup.start(None);

    // A scope with content in Garage and a running owner.
    let sc = d.draft("thread-del");
    let scope = s(&sc, "scope_id");
    let mp = d.mountpoint(&scope);
    std::fs::write(mp.join("result.txt"), vec![7u8; 300_000]).unwrap();
    std::fs::File::open(mp.join("result.txt")).unwrap().sync_all().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while object_count(&rt, &store, &scope) == 0 {
        assert!(Instant::now() < deadline, "the file never reached Garage");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, o) = d.new_owner(&scope, json!({"owner_type": "background_process", "resource_id": "proc-1"}));
    let oid = s(&o, "owner_id");
    d.patch_owner(&scope, &oid, json!({"state": "active"}));

    // Delete: stays deleting (and says which owner) after the bounded drain; writes are frozen.
    let (st, del) = d.patch_scope(&scope, &sc["revision"], "deleting");
    assert_eq!((st, s(&del, "state")), (StatusCode::OK, "deleting".into()), "{del}");
    let err = std::fs::write(mp.join("late.txt"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "writes through the mount are refused while deleting");
    // The drain (SCOPEFS_DELETE_DRAIN_SECS=2) times out; the scope stays deleting, blocked by the owner.
    d.wait_log("delete drain timed out");
    let cur = d.by_thread("thread-del").1;
    assert_eq!(s(&cur, "state"), "deleting");
    assert_eq!(cur["delete_blocked_by"], json!([oid]), "{cur}");
    assert!(is_mounted(&mp), "nothing is unmounted while owners run");

    // Once the owner is terminal the maintenance pass finishes the delete.
    let (st, _) = d.patch_owner(&scope, &oid, json!({"state": "terminal"}));
    assert_eq!(st, StatusCode::OK);
    let gone = d.wait_scope("thread-del", "deleted", |b| b["state"] == "deleted");
    assert!(gone["delete_blocked_by"].is_null() && gone["deleted_at"].is_i64(), "{gone}");
    assert!(!is_mounted(&mp), "the mount is gone");
    let (st, _) = call(d.req("GET", "/api/workspace/file?threadId=thread-del&path=result.txt"));
    assert_eq!(st, StatusCode::NOT_FOUND, "a deleted scope's files answer 404");
    assert!(object_count(&rt, &store, &scope) > 0, "objects stay until the retention ends");

    // Draft expiry: only drafts older than the TTL without other live owners.
    let old = d.draft("old-draft");
    let busy = d.draft("busy-draft");
    let (_, w) = d.new_owner(&s(&busy, "scope_id"), json!({"owner_type": "memory_worker"}));
    assert_eq!(s(&w, "state"), "reserved");
    let active = d.draft("active-scope");
    let (st, _) =
        d.reserve(&s(&active, "scope_id"), json!({"run_request_id": "rr", "turn_id": "t", "request_hash": "h"}));
    assert_eq!(st, StatusCode::CREATED);
    setup.set_clock_offset(25 * HOUR);
    let young = d.draft("young-draft");
    d.wait_scope("old-draft", "deleted", |b| b["state"] == "deleted");
    // Two more passes, both started after the expiry was seen, leave the others alone.
    let passes = d.maintenance_passes();
    d.wait_passes(passes, 2);
    assert_eq!(s(&d.by_thread("young-draft").1, "state"), "draft");
    assert_eq!(s(&d.by_thread("busy-draft").1, "state"), "draft");
    assert_eq!(s(&d.by_thread("active-scope").1, "state"), "active");
    assert!(!is_mounted(&d.mountpoint(&s(&old, "scope_id"))));
    assert!(is_mounted(&d.mountpoint(&s(&young, "scope_id"))));
    // Issue 24, item 8: the trash (deleted, not purged yet) is measured apart from purged scopes.
    assert_eq!(metric(&d, "scopefs_scopes_in_trash"), 2, "thread-del and old-draft");

    // After the retention the deleted scope's objects are purged from Garage.
    setup.set_clock_offset(25 * HOUR + 8 * DAY);
    let purged = d.wait_scope("thread-del", "purged", |b| b["purged_at"].is_i64());
    assert_eq!(s(&purged, "state"), "deleted");
    assert_eq!(object_count(&rt, &store, &scope), 0, "objects left in Garage after the purge");
    assert!(!setup.dir.path().join("data/scopes").join(&scope).exists(), "local metadata left after the purge");
    // Live scopes keep theirs (the young draft expired meanwhile; the active one stays).
    assert_eq!(s(&d.by_thread("active-scope").1, "state"), "active");
}

#[test]
fn kill_during_provision_and_delete_then_restart() {
    let setup = Setup::local();
    // Provision interrupted after the record, and after the mount: finished on restart.
    for (i, fp) in ["provision_after_record", "provision_after_mount"].into_iter().enumerate() {
        let thread = format!("crash-p{i}");
        let mut d = setup.start(Some(fp));
        let sent = d
            .req("POST", "/internal/workspace-scopes/provision")
            .json(&json!({"operation_id": format!("op-{thread}"), "primary_thread_id": thread}))
            .send();
        assert!(sent.is_err(), "{fp}: the daemon answered instead of aborting");
        d.wait_aborted();
        drop(d);
        let d = setup.start(None);
        let (st, rec) = d.by_thread(&thread);
        assert_eq!((st, s(&rec, "state")), (StatusCode::OK, "draft".into()), "{fp}: {rec}");
        let scope = s(&rec, "scope_id");
        assert!(is_mounted(&d.mountpoint(&scope)), "{fp}: the recovered scope is mounted");
        std::fs::write(d.mountpoint(&scope).join("ok.txt"), b"ok").unwrap();
        let (st, again) = d.provision(&format!("op-{thread}"), &thread);
        assert_eq!((st, s(&again, "scope_id")), (StatusCode::OK, scope), "{fp}: retry returns the same scope");
    }
    // Delete interrupted after `deleting` was recorded, and after the unmount: finished on restart.
    for (i, fp) in ["delete_after_mark", "delete_after_unmount"].into_iter().enumerate() {
        let thread = format!("crash-d{i}");
        let mut d = setup.start(Some(fp));
        let sc = d.draft(&thread);
        let scope = s(&sc, "scope_id");
        let sent = d
            .req("PATCH", &format!("/internal/workspace-scopes/{scope}"))
            .json(&json!({"expected_revision": sc["revision"], "state": "deleting"}))
            .send();
        assert!(sent.is_err(), "{fp}: the daemon answered instead of aborting");
        d.wait_aborted();
        drop(d);
        let d = setup.start(None);
        let (st, rec) = d.by_thread(&thread);
        assert_eq!((st, s(&rec, "state")), (StatusCode::OK, "deleted".into()), "{fp}: {rec}");
        assert!(!is_mounted(&d.mountpoint(&scope)), "{fp}: no mount of a deleted scope");
    }
    // Every scope is either whole (draft) or deleted: none is left provisioning or deleting.
    let d = setup.start(None);
    for t in ["crash-p0", "crash-p1", "crash-d0", "crash-d1"] {
        let state = s(&d.by_thread(t).1, "state");
        assert!(state == "draft" || state == "deleted", "{t} is {state}");
    }
}

/// A request path for a route template, with every parameter filled in.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|seg| match seg {
            "{scope_id}" => uuid::Uuid::now_v7().to_string(),
            s if s.starts_with('{') => "x1".to_string(),
            s => s.to_string(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[test]
fn every_route_needs_the_token_and_openapi_matches_the_router() {
    let setup = Setup::local();
    let d = setup.start(None);
    let (st, doc) = call(d.http.get(format!("{}/openapi.json", d.serve.base)));
    assert_eq!(st, StatusCode::OK);
    let mut listed = BTreeSet::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            listed.insert((method.to_uppercase(), path.clone(), op["x-scopefs-auth"].as_str().unwrap().to_owned()));
        }
    }
    // Every route of SPEC §7.1 is there, behind the service token.
    for (m, p) in [
        ("POST", "/internal/workspace-scopes/provision"),
        ("GET", "/internal/workspace-scopes/by-thread/{thread_id}"),
        ("PATCH", "/internal/workspace-scopes/{scope_id}"),
        ("POST", "/internal/workspace-scopes/{scope_id}/owners"),
        ("PATCH", "/internal/workspace-scopes/{scope_id}/owners/{owner_id}"),
        ("GET", "/internal/workspace-scopes/{scope_id}/owners/by-resource/{resource_id}"),
        ("POST", "/internal/workspace-scopes/{scope_id}/runs/reserve"),
        ("PATCH", "/internal/workspace-scopes/{scope_id}/runs/{run_request_id}"),
        ("GET", "/internal/workspace-scopes/{scope_id}/mount"),
        ("POST", "/internal/leases/{lock_name}"),
        ("PATCH", "/internal/leases/{lock_name}"),
        ("DELETE", "/internal/leases/{lock_name}"),
    ] {
        assert!(listed.contains(&(m.into(), p.into(), "service_token".into())), "{m} {p} missing from /openapi.json");
    }
    let mut checked = 0;
    for (method, path, auth) in &listed {
        let url = format!("{}{}", d.serve.base, concrete(path));
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        if path.starts_with("/internal") || path.starts_with("/api") {
            assert_eq!(auth, "service_token", "{method} {path} is not behind the service token");
            for token in [None, Some(format!("{}x", d.token)), Some("wrong".to_string())] {
                let mut req = d.http.request(m.clone(), &url).json(&json!({}));
                if let Some(t) = &token {
                    req = req.bearer_auth(t);
                }
                let (st, body) = call(req);
                assert_eq!(
                    (st, code(&body)),
                    (StatusCode::UNAUTHORIZED, "unauthorized"),
                    "{method} {path} token {token:?}"
                );
            }
            checked += 1;
        }
        // Served by the router: with the token, never the route-not-found or method-not-allowed fallback.
        let resp = d.http.request(m.clone(), &url).bearer_auth(&d.token).send().unwrap();
        let status = resp.status();
        let body: Value = resp.json().unwrap_or(Value::Null);
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path} is listed but not served");
        assert!(
            !(status == StatusCode::NOT_FOUND && body["error"]["code"] == "not_found"),
            "{method} {path} is listed but the router does not know it"
        );
    }
    assert!(checked >= 12, "only {checked} token-protected routes found");
    // An unlisted path is the router's 404; an unlisted method on a listed path is 405.
    let (st, body) = call(d.req("GET", "/internal/workspace-scopes-nope"));
    assert_eq!((st, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
    let (st, body) = call(d.req("PUT", "/internal/workspace-scopes/provision"));
    assert_eq!((st, code(&body)), (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"));
    let (st, _) = call(d.http.get(format!("{}/internal/nothing-here", d.serve.base)));
    assert_eq!(st, StatusCode::NOT_FOUND);
}
