//! Contract of the compute `/tools/*` routes against seed 003 (issue 12, acceptance a and b).
//!
//! a. Every compute route is called with a body built from seed 003's own examples (§4.5 method
//!    signatures, §4.3 `execute_command`, §5 `create_environment`) — field names and JSON types as
//!    the seed writes them — and its answer is checked field by field (names and JSON types); a
//!    field the daemon does not know is a 400 naming it on every route.
//! b. End to end: create with `default_output_paths` → a command writes files → destroy → the
//!    artifacts (path, size, sha256, content type) are in the answer → `/admin/pending-usage` lists
//!    them (`id`, `artifacts_registered`, `output_manifest_json`) → a registrar that fails twice
//!    then succeeds → settled exactly once; ledger, usage log and artifact registry agree.
//!
//! c. Seed 003 §16.3, the gateway's smoke test, on Garage, in both billing modes (issue 24,
//!    acceptance b): exactly one charge per environment whoever settles.
//!
//! Needs root, /dev/fuse, a Docker engine, `SCOPEFS_TEST_DOCKER_IMAGE` and
//! `SCOPEFS_TEST_PYTHON_IMAGE` (scripts/docker.sh) and Garage (`SCOPEFS_TEST_S3_*`,
//! scripts/garage.sh); without them it fails.

pub mod compute_support;
pub mod serve_process;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use compute_support::{
    admin_call, compute_toml, docker_image as image, provision, python_image, signed_call, uid, Secrets,
};
use reqwest::blocking::Client;
use reqwest::StatusCode;
use scopefs::billing::{run_pending_pass, ArtifactRegistrar, PassSettings, PricingConfig, RegistryRegistrar};
use scopefs::registry::billing::UsageRecord;
use scopefs::registry::Registry;
use serde_json::{json, Value};
use serve_process::{free_port, write_config, ServeProcess};
use sha2::{Digest, Sha256};

const SERVICE_TOKEN: &str = "contract-compute-service-token-0123456789";
const HMAC_SECRET: &str = "contract-compute-hmac-secret";
const ADMIN_TOKEN: &str = "contract-compute-admin-token";
const USER: &str = "test_user";

/// New accounts get `pro`; `metered` pays every minute from cash. The loop runs once at startup
/// and then waits an hour: the test drives the settlement rounds itself.
const PRICING: &str = "[pricing]\ndefault_plan = \"pro\"\nsettle_interval_secs = 3600\n\
    [pricing.plans.pro]\ncompute_allowed = true\nmonthly_minutes = 120\nhard_max_runtime_seconds = 7200\n\
    [pricing.plans.metered]\ncompute_allowed = true\nmonthly_minutes = 0\nhard_max_runtime_seconds = 7200\n";

struct Daemon {
    serve: ServeProcess,
    client: Client,
    deployment: String,
    image: String,
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        Daemon::start_with(dir, image(), PRICING, &[])
    }

    /// A daemon running `image` with `extra` configuration (pricing and billing sections) and
    /// `env` (`SCOPEFS_*` overrides).
    fn start_with(dir: &Path, image: String, extra: &str, env: &[(&str, &str)]) -> Daemon {
        let port = free_port();
        let deployment = format!("cc-{}", &uid()[20..]);
        let secrets =
            Secrets { service_token: SERVICE_TOKEN, hmac_secret: HMAC_SECRET, admin_token: Some(ADMIN_TOKEN) };
        let rest = compute_toml(&deployment, &secrets, &image, extra);
        let cfg = write_config(dir, port, &rest);
        let serve = ServeProcess::start(dir, &cfg, port, &format!("daemon-{}.log", uid()), env);
        let mut d = Daemon {
            serve,
            client: Client::builder().timeout(Duration::from_secs(120)).build().unwrap(),
            deployment,
            image,
        };
        d.serve.wait_ready(&d.client);
        d
    }

    fn provision(&self, thread: &str) {
        provision(&self.client, &self.serve.base, SERVICE_TOKEN, thread, None);
    }

    /// A signed `/tools/<tool>` call (seed 003 §4.3: `auth_context` with the HMAC token).
    fn tool(&self, thread: &str, tool: &str, params: Value) -> (StatusCode, Value) {
        signed_call(&self.client, &self.serve.base, HMAC_SECRET, (USER, thread), tool, params, None)
    }

    fn ok(&self, thread: &str, tool: &str, params: Value) -> Value {
        let (s, v) = self.tool(thread, tool, params);
        assert_eq!(s, StatusCode::OK, "{tool}: {v}\nlog:\n{}", self.serve.log_text());
        v
    }

    fn admin(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        admin_call(&self.client, (&self.serve.base, ADMIN_TOKEN), method, path, body)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("label=io.scopefs.deployment={}", self.deployment)])
            .output();
        if let Ok(out) = out {
            for c in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = Command::new("docker").args(["rm", "-f", c]).output();
            }
        }
    }
}

/// The JSON type of a value, as the seed's Python types map to JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum T {
    Str,
    Int,
    Bool,
    Arr,
    /// A string or null (`str | None`).
    OptStr,
    /// An integer or null (`int | None`).
    OptInt,
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() || n.is_u64() => "int",
        Value::Number(_) => "float",
        Value::String(_) => "str",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Asserts that `v` has each field with its JSON type.
fn assert_shape(what: &str, v: &Value, fields: &[(&str, T)]) {
    for (name, want) in fields {
        let got = v.get(*name).unwrap_or_else(|| panic!("{what}: no field {name:?} in {v}"));
        let ok = match want {
            T::Str => got.is_string(),
            T::Int => got.is_i64() || got.is_u64(),
            T::Bool => got.is_boolean(),
            T::Arr => got.is_array(),
            T::OptStr => got.is_string() || got.is_null(),
            T::OptInt => got.is_i64() || got.is_u64() || got.is_null(),
        };
        assert!(ok, "{what}: field {name:?} is {} ({got}), expected {want:?}", type_of(got));
    }
}

/// The fields every environment answer carries (seed 003 §5 response plus the record).
const ENV_FIELDS: &[(&str, T)] = &[
    ("environment_id", T::Str),
    ("status", T::Str),
    ("execution_mode", T::Str),
    ("backend_type", T::Str),
    ("resource_ref", T::Str),
    ("effective_max_runtime_seconds", T::Int),
    ("requested_max_runtime_seconds", T::OptInt),
    ("created_at", T::Int),
    ("started_at", T::OptInt),
    ("ended_at", T::OptInt),
    ("runtime_seconds", T::OptInt),
    ("end_reason", T::OptStr),
];

const ARTIFACT_FIELDS: &[(&str, T)] = &[
    ("artifact_id", T::Str),
    ("object_key", T::Str),
    ("path", T::Str),
    ("logical_path", T::Str),
    ("size_bytes", T::Int),
    ("sha256", T::Str),
    ("content_type", T::Str),
];

/// Seed 003 §5's `create_environment` example, with this daemon's image and a 300 s budget.
fn seed_create_body(image: &str, thread: &str) -> Value {
    json!({
        "execution_mode": "simple",
        "shared_compute_eligible": true,
        "resource_class": "shared-small",
        "backend_policy": "auto",
        "input_objects": [{
            "file_id": "file_123",
            "object_key": format!("threads/{thread}/files/file_123"),
            "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "size_bytes": 1024,
            "mount_path": "/workspace/data.csv",
            "read_only": false
        }],
        "artifact_prefix": format!("jobs/{thread}/req_1/artifacts/"),
        "default_output_paths": ["/workspace/out"],
        "max_runtime_seconds": 300,
        "budget_snapshot": {
            "plan": "pro",
            "quota_ok": true,
            "remaining_minutes": 120,
            "cash_balance_snapshot": "10.000000",
            "overtime_price_per_minute": "0.050000",
            "affordable_runtime_seconds": 19200,
            "effective_max_runtime_seconds": 300,
            "pricing_version": "2026-05-23"
        },
        "limits": {
            "max_input_bytes": 10485760,
            "max_output_bytes": 10485760,
            "max_stdout_stderr_bytes": 1048576,
            "max_files": 100
        },
        "image_ref": image
    })
}

/// A field the daemon does not know is a 400 that names it, on `tool`.
fn assert_unknown_field_refused(d: &Daemon, thread: &str, tool: &str, mut body: Value) {
    body["no_such_field_xyz"] = json!(1);
    let (s, v) = d.tool(thread, tool, body);
    assert_eq!(s, StatusCode::BAD_REQUEST, "{tool}: {v}");
    assert!(v.to_string().contains("no_such_field_xyz"), "{tool}: the 400 does not name the field: {v}");
}

#[test]
fn compute_routes_take_the_seed_bodies_and_answer_the_seed_fields() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    // The default plan of new accounts is said at startup (item 8).
    let log = d.serve.log_text();
    assert!(log.contains("new accounts get plan") && log.contains("pricing.default_plan"), "{log}");
    let t = format!("thr_{}", uid());
    d.provision(&t);

    let created = d.ok(&t, "create_environment", seed_create_body(&d.image, &t));
    assert_shape("create_environment", &created, ENV_FIELDS);
    assert_eq!((created["status"].as_str(), created["execution_mode"].as_str()), (Some("running"), Some("standard")));
    assert_eq!(created["backend_type"], "docker");
    assert_eq!(created["effective_max_runtime_seconds"], 300);
    let env = created["environment_id"].as_str().unwrap().to_string();

    let listed = d.ok(&t, "list_environments", json!({}));
    assert_shape("list_environments", &listed, &[("environments", T::Arr)]);
    assert_shape("list_environments[0]", &listed["environments"][0], ENV_FIELDS);

    let status = d.ok(&t, "get_environment_status", json!({"environment_id": env}));
    assert_shape("get_environment_status", &status, ENV_FIELDS);

    // Seed 003 §4.3's example body, plus §4.5's optional fields.
    let exec = json!({"environment_id": env, "command": "echo hello", "timeout_seconds": 30, "max_output_bytes": 4096});
    let out = d.ok(&t, "execute_command", exec.clone());
    assert_shape(
        "execute_command",
        &out,
        &[
            ("stdout", T::Str),
            ("stderr", T::Str),
            ("exit_code", T::OptInt),
            ("truncated", T::Bool),
            ("timed_out", T::Bool),
        ],
    );
    assert_eq!(out["stdout"], "hello\n");

    let proc_fields: &[(&str, T)] =
        &[("process_id", T::Str), ("environment_id", T::Str), ("state", T::Str), ("command", T::Str)];
    let p = d.ok(&t, "start_process", json!({"environment_id": env, "command": "echo started; sleep 300"}));
    assert_shape("start_process", &p, proc_fields);
    let pid = p["process_id"].as_str().unwrap().to_string();
    let checked = d.ok(&t, "check_process", json!({"process_id": pid, "tail_bytes": 1024}));
    assert_shape("check_process", &checked, proc_fields);
    assert_shape("check_process", &checked, &[("log_tail", T::Str), ("log_bytes", T::Int), ("log_truncated", T::Bool)]);
    let procs = d.ok(&t, "list_processes", json!({"environment_id": env}));
    assert_shape("list_processes", &procs, &[("processes", T::Arr)]);
    assert_shape("list_processes[0]", &procs["processes"][0], proc_fields);
    let stopped = d.ok(&t, "stop_process", json!({"process_id": pid}));
    assert_shape("stop_process", &stopped, proc_fields);

    // Every route refuses a field it does not know, by name.
    let cases = [
        ("create_environment", json!({})),
        ("destroy_environment", json!({"environment_id": env})),
        ("list_environments", json!({})),
        ("get_environment_status", json!({"environment_id": env})),
        ("execute_command", exec),
        ("start_process", json!({"environment_id": env, "command": "true"})),
        ("check_process", json!({"process_id": pid})),
        ("stop_process", json!({"process_id": pid})),
        ("list_processes", json!({})),
    ];
    for (tool, body) in cases {
        assert_unknown_field_refused(&d, &t, tool, body);
    }
    let mut bad_limits = seed_create_body(&d.image, &t);
    bad_limits["limits"]["max_gpus"] = json!(1);
    let (s, v) = d.tool(&t, "create_environment", bad_limits);
    assert!(s == StatusCode::BAD_REQUEST && v.to_string().contains("max_gpus"), "{s} {v}");
    // An image the configuration does not allow is refused before anything runs.
    let mut other_image = seed_create_body(&d.image, &t);
    other_image["image_ref"] = json!("docker.io/library/ubuntu:latest");
    let (s, v) = d.tool(&t, "create_environment", other_image);
    assert_eq!(
        (s, v["error"]["code"].as_str().or(v["code"].as_str())),
        (StatusCode::FORBIDDEN, Some("image_not_allowed")),
        "{v}"
    );

    // Seed 003 §4.5 destroy_environment(persist_outputs, output_paths, force_destroy, artifact_prefix).
    d.ok(
        &t,
        "execute_command",
        json!({"environment_id": env, "command": "mkdir -p /workspace/out && echo a,b > /workspace/out/r.csv"}),
    );
    let destroyed = d.ok(
        &t,
        "destroy_environment",
        json!({"environment_id": env, "persist_outputs": true, "output_paths": ["/workspace/out"],
               "force_destroy": false, "artifact_prefix": format!("jobs/{t}/req_1/artifacts/")}),
    );
    assert_shape("destroy_environment", &destroyed, ENV_FIELDS);
    assert_shape(
        "destroy_environment",
        &destroyed,
        &[("artifacts", T::Arr), ("artifacts_lost", T::Bool), ("already_ended", T::Bool)],
    );
    assert_eq!(destroyed["status"], "ended");
    assert_shape("destroy_environment.artifacts[0]", &destroyed["artifacts"][0], ARTIFACT_FIELDS);
    assert_eq!(destroyed["artifacts"][0]["path"], "/workspace/out/r.csv");
    assert_eq!(destroyed["artifacts"][0]["content_type"], "text/csv");
    // Issue 24, item 6: an id, and the key of seed 003's layout that names it (and grants it).
    assert_eq!(destroyed["artifacts"][0]["object_key"], format!("threads/{t}/files/out/r.csv"));

    // The environment's own limits bound its outputs: past them, destroy still ends the environment
    // (its usage is recorded and billed as any other) and answers which output paths were not
    // recorded (issue 24, item 6; at 2351eb5 it was 507 and the environment ran on, billing).
    let body = json!({"default_output_paths": ["/workspace/out"], "limits": {"max_files": 1}});
    let env2 = d.ok(&t, "create_environment", body)["environment_id"].as_str().unwrap().to_string();
    let two_files = "echo 2 > /workspace/out/second.txt && echo 3 > /workspace/out/third.txt";
    d.ok(&t, "execute_command", json!({"environment_id": env2, "command": two_files}));
    let past = d.ok(&t, "destroy_environment", json!({"environment_id": env2}));
    let got = (past["status"].as_str(), past["artifacts"].as_array().map(Vec::len), past["artifacts_lost"].as_bool());
    assert_eq!(got, (Some("ended"), Some(0), Some(true)), "{past}");
    assert_eq!(past["outputs_not_recorded"], json!(["/workspace/out"]), "{past}");
    let usage = |settled: u8| d.admin(reqwest::Method::POST, "/admin/pending-usage", Some(json!({"settled": settled})));
    let recorded = [usage(0), usage(1)]
        .iter()
        .any(|l| l["usage"].as_array().unwrap().iter().any(|u| u["environment_id"] == env2.as_str()));
    assert!(recorded, "its usage is recorded");
}

/// Fails its first `fail_first` calls, then registers through the daemon's own registrar.
struct FailThenRegistry {
    calls: AtomicU32,
    fail_first: u32,
    inner: RegistryRegistrar,
}

impl ArtifactRegistrar for FailThenRegistry {
    fn register(&self, usage: &UsageRecord, paths: &[String]) -> Result<(), String> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.fail_first {
            return Err("artifact store unavailable".into());
        }
        self.inner.register(usage, paths)
    }
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// The pricing of the daemon's configuration (the test settles with the same prices).
fn daemon_pricing() -> PricingConfig {
    #[derive(serde::Deserialize)]
    struct Only {
        pricing: PricingConfig,
    }
    toml::from_str::<Only>(PRICING).unwrap().pricing
}

#[test]
fn outputs_become_artifacts_registered_with_retries_then_settled_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let t = format!("thr_{}", uid());
    d.provision(&t);
    d.admin(reqwest::Method::PUT, &format!("/admin/accounts/{USER}/plan"), Some(json!({"plan": "metered"})));
    d.admin(
        reqwest::Method::POST,
        &format!("/admin/accounts/{USER}/credit"),
        Some(json!({"amount": "1.000000", "idempotency_key": "seed-credit"})),
    );
    // Issue 24, item 6: a file already there and left unchanged is not an output.
    d.ok(&t, "write_file", json!({"path": "before.txt", "content": "was here"}));

    let outputs = json!(["/workspace/out", "/workspace/before.txt"]);
    let env = d.ok(&t, "create_environment", json!({"default_output_paths": outputs, "max_runtime_seconds": 120}))
        ["environment_id"]
        .as_str()
        .unwrap()
        .to_string();
    let cmd = "mkdir -p /workspace/out/sub && printf 'x,y\\n1,2\\n' > /workspace/out/result.csv \
               && printf 'note' > /workspace/out/sub/n.txt && echo outside > /workspace/not-an-output.txt";
    let out = d.ok(&t, "execute_command", json!({"environment_id": env, "command": cmd}));
    assert_eq!(out["exit_code"], 0, "{out}");

    let destroyed = d.ok(&t, "destroy_environment", json!({"environment_id": env}));
    let arts = destroyed["artifacts"].as_array().expect("artifacts").clone();
    let expect = [
        ("/workspace/out/result.csv", &b"x,y\n1,2\n"[..], "text/csv"),
        ("/workspace/out/sub/n.txt", b"note", "text/plain"),
    ];
    assert_eq!(arts.len(), expect.len(), "{destroyed}");
    for (a, (path, content, ctype)) in arts.iter().zip(expect) {
        assert_eq!(a["path"], path);
        assert_eq!(a["size_bytes"], content.len());
        assert_eq!(a["sha256"], sha256_hex(content));
        assert_eq!(a["content_type"], ctype);
    }

    // The seed's poll loop reads the pending record: id, artifacts_registered, output_manifest_json.
    let pending = d.admin(reqwest::Method::POST, "/admin/pending-usage", Some(json!({"settled": 0, "limit": 50})));
    let rec = pending["usage"].as_array().unwrap().iter().find(|r| r["environment_id"] == env.as_str()).cloned();
    let rec = rec.unwrap_or_else(|| panic!("no pending usage for {env}: {pending}"));
    assert_eq!(rec["artifacts_registered"], false, "{rec}");
    let usage_id = rec["id"].as_i64().expect("id");
    assert_eq!(rec["usage_id"], usage_id);
    // Issue 24 item 8: the price the environment was admitted at goes with its usage.
    let price: Value = serde_json::from_str(rec["pricing_snapshot"].as_str().expect("pricing snapshot")).unwrap();
    assert_eq!(price["overtime_price_per_minute"], daemon_pricing().overtime_price_per_minute.to_string(), "{rec}");
    let manifest: Value = serde_json::from_str(rec["output_manifest_json"].as_str().expect("manifest JSON")).unwrap();
    assert_eq!(manifest, Value::Array(arts.clone()), "the manifest is what destroy answered");

    // The settlement rounds, run against the daemon's registry with a registrar failing twice.
    let reg = Arc::new(Registry::open(&dir.path().join("data/control/registry.sqlite3")).unwrap());
    let pricing = daemon_pricing();
    let registrar =
        FailThenRegistry { calls: AtomicU32::new(0), fail_first: 2, inner: RegistryRegistrar::new(reg.clone()) };
    let settings = PassSettings::default();
    for attempt in 1..=2 {
        let r = run_pending_pass(&reg, &pricing, &registrar, &settings).unwrap();
        assert_eq!((r.artifact_failures, r.settled), (1, 0), "attempt {attempt}");
        let acct = d.admin(reqwest::Method::GET, &format!("/admin/accounts/{USER}"), None);
        assert_eq!(acct["cash_balance"], "1.000000", "no money before the artifacts are registered: {acct}");
    }
    let r = run_pending_pass(&reg, &pricing, &registrar, &settings).unwrap();
    assert_eq!((r.artifacts_registered, r.settled), (1, 1), "{r:?}");
    let r = run_pending_pass(&reg, &pricing, &registrar, &settings).unwrap();
    assert_eq!((r.listed, r.settled), (0, 0), "settled exactly once");

    let settled = d.admin(reqwest::Method::POST, "/admin/pending-usage", Some(json!({"settled": 1})));
    let rec =
        settled["usage"].as_array().unwrap().iter().find(|r| r["id"] == usage_id).cloned().expect("settled record");
    assert_eq!(
        (rec["settlement_status"].as_str(), rec["artifacts_registered"].as_bool()),
        (Some("settled"), Some(true))
    );
    let ledger = d.admin(reqwest::Method::GET, &format!("/admin/accounts/{USER}/ledger"), None);
    let rows: Vec<&Value> =
        ledger["entries"].as_array().unwrap().iter().filter(|e| e["entry_type"] == "compute_overtime").collect();
    assert_eq!(rows.len(), 1, "{ledger}");
    assert_eq!(rows[0]["source_id"], env.as_str());
    assert_eq!(rec["ledger_entry_id"], rows[0]["entry_id"]);
    // The artifact registry holds the same manifest, every row registered.
    let registered = reg.artifact_manifest(&env).unwrap();
    assert_eq!(registered.len(), arts.len());
    assert!(registered.iter().all(|r| r.registered_at.is_some()), "{registered:?}");
    for (row, a) in registered.iter().zip(&arts) {
        assert_eq!(
            (row.entry.sha256.as_str(), row.entry.size_bytes),
            (a["sha256"].as_str().unwrap(), a["size_bytes"].as_u64().unwrap())
        );
    }
    let audit = reg.billing_audit().unwrap();
    assert!(audit.problems.is_empty(), "{:?}", audit.problems);
    // Marking by the seed's ids is accepted (idempotent: nothing left to change).
    let marked =
        d.admin(reqwest::Method::POST, "/admin/mark-artifacts-registered", Some(json!({"environment_id": env})));
    assert_eq!(marked["updated"], 0);
    let marked =
        d.admin(reqwest::Method::POST, "/admin/mark-artifacts-registered", Some(json!({"usage_id": usage_id})));
    assert_eq!(marked["updated"], 0);
}

/// Issue 24 item 6: an artifact keeps its bytes. Destroy lists the outputs (only what the
/// environment made), takes a snapshot of the scope (O(metadata)) and hashes them there; each
/// artifact names the snapshot, which reads back the recorded bytes after the file changed.
#[test]
fn an_artifact_keeps_its_bytes_after_its_file_changes() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let t = format!("thr_{}", uid());
    d.provision(&t);
    d.ok(&t, "write_file", json!({"path": "/workspace/out/old.txt", "content": "there before"}));
    let env = d.ok(&t, "create_environment", json!({"default_output_paths": ["/workspace/out"]}))["environment_id"]
        .as_str()
        .unwrap()
        .to_string();
    d.ok(&t, "write_file", json!({"path": "/workspace/out/a.txt", "content": "as recorded"}));
    let done = d.ok(&t, "destroy_environment", json!({"environment_id": env}));
    let arts = done["artifacts"].as_array().expect("artifacts");
    assert_eq!(arts.len(), 1, "only what the environment made: {done}");
    assert_eq!(arts[0]["sha256"], sha256_hex(b"as recorded"));
    let snapshot = arts[0]["snapshot_id"].as_str().expect("the artifact names the snapshot that keeps it");
    assert_eq!(snapshot, format!("out.{env}"));

    d.ok(&t, "write_file", json!({"path": "/workspace/out/a.txt", "content": "changed after"}));
    let read = |snapshot: Option<&str>| {
        let mut url = format!("{}/api/workspace/file?threadId={t}&path=/out/a.txt", d.serve.base);
        if let Some(s) = snapshot {
            url.push_str(&format!("&snapshotId={s}"));
        }
        let resp = d.client.get(url).bearer_auth(SERVICE_TOKEN).send().unwrap();
        (resp.status(), resp.bytes().unwrap().to_vec())
    };
    assert_eq!(read(Some(snapshot)), (StatusCode::OK, b"as recorded".to_vec()), "the artifact's bytes as hashed");
    assert_eq!(read(None), (StatusCode::OK, b"changed after".to_vec()), "the live file moved on");
    // The pending usage's manifest names the same snapshot.
    let pending = d.admin(reqwest::Method::POST, "/admin/pending-usage", Some(json!({"settled": 0, "limit": 50})));
    let usage = pending["usage"].as_array().unwrap().iter().find(|u| u["environment_id"] == env.as_str()).cloned();
    let manifest: Value =
        serde_json::from_str(usage.as_ref().and_then(|u| u["output_manifest_json"].as_str()).unwrap_or("null"))
            .unwrap();
    assert_eq!(manifest[0]["snapshot_id"], format!("out.{env}"), "{pending}");
}

/// Review N7: an environment's outputs are listed and hashed, so the signed grant must cover each
/// output path, at create (`default_output_paths`) and at destroy (`output_paths`, else the
/// defaults): otherwise 403 `object_scope_denied`, nothing outside the grant named, and the
/// environment keeps running until a destroy the grant covers.
#[test]
fn outputs_outside_the_signed_grant_are_refused_at_create_and_at_destroy() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let t = format!("thr_{}", uid());
    d.provision(&t);
    let grant = json!({"read": ["/workspace/in"], "write_prefixes": ["/workspace/in"]});
    let scoped = |tool: &str, params: Value| {
        signed_call(&d.client, &d.serve.base, HMAC_SECRET, (USER, &t), tool, params, Some(grant.clone()))
    };
    let denied = |(status, v): (StatusCode, Value), what: &str| {
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("object_scope_denied")),
            "{what}: {v}"
        );
        assert!(!v.to_string().contains("secret"), "{what} names a file outside the grant: {v}");
    };
    let (s, v) = scoped("write_file", json!({"path": "/workspace/in/a.txt", "content": "inside"}));
    assert_eq!(s, StatusCode::OK, "{v}");
    d.ok(&t, "write_file", json!({"path": "/workspace/secret.txt", "content": "outside"}));

    denied(scoped("create_environment", json!({"default_output_paths": ["/workspace"]})), "create, whole workspace");
    denied(scoped("create_environment", json!({"default_output_paths": ["/workspace/in", "secret.txt"]})), "create");
    let env =
        d.ok(&t, "create_environment", json!({"default_output_paths": ["/workspace"], "max_runtime_seconds": 120}))
            ["environment_id"]
            .as_str()
            .unwrap()
            .to_string();
    // The environment's output (written after its creation: files left unchanged are not outputs).
    let (s, v) = scoped("write_file", json!({"path": "/workspace/in/a.txt", "content": "inside"}));
    assert_eq!(s, StatusCode::OK, "{v}");
    denied(scoped("destroy_environment", json!({"environment_id": env})), "destroy, the defaults");
    denied(scoped("destroy_environment", json!({"environment_id": env, "output_paths": ["/workspace"]})), "destroy");
    denied(
        scoped("destroy_environment", json!({"environment_id": env, "output_paths": ["/workspace/in", "secret.txt"]})),
        "destroy, one path outside",
    );
    let status = d.ok(&t, "get_environment_status", json!({"environment_id": env}));
    assert_eq!(status["status"], "running", "a refused destroy leaves the environment as it was: {status}");

    let (s, destroyed) =
        scoped("destroy_environment", json!({"environment_id": env, "output_paths": ["/workspace/in"]}));
    assert_eq!(s, StatusCode::OK, "{destroyed}");
    let paths: Vec<&str> =
        destroyed["artifacts"].as_array().expect("artifacts").iter().map(|a| a["path"].as_str().unwrap()).collect();
    assert_eq!(paths, vec!["/workspace/in/a.txt"], "{destroyed}");

    // The seed's default output paths name the global store as well; an environment without it
    // read-write collects nothing there, so a grant of the workspace alone creates and destroys.
    let workspace = json!({"write_prefixes": ["/workspace"]});
    let whole = |tool: &str, params: Value| {
        signed_call(&d.client, &d.serve.base, HMAC_SECRET, (USER, &t), tool, params, Some(workspace.clone()))
    };
    let (s, v) = whole("create_environment", json!({"default_output_paths": ["/workspace", "/__global__"]}));
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = whole("destroy_environment", json!({"environment_id": v["environment_id"]}));
    assert_eq!(s, StatusCode::OK, "{v}");
}

/// Issue 24, item 4: the create bodies a seed gateway sends are taken (each was a 400 at 2351eb5):
/// seed 003 §15.2's whole `limits` block (`max_user_concurrency` included), §7.3's default output
/// paths (`/workspace` and `/__global__`: this manifest grants no writable global store, so it
/// holds no outputs; `peer_mounts.rs` has one that does) and a §3.7 manifest listing every file of the conversation (more than 64 entries).
#[test]
fn seed_shaped_create_bodies_are_taken() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let t = format!("thr_{}", uid());
    d.provision(&t);
    d.ok(&t, "write_file", json!({"path": "before.txt", "content": "was here"}));
    let mut body = seed_create_body(&d.image, &t);
    body["limits"]["max_user_concurrency"] = json!(2);
    body["default_output_paths"] = json!(["/workspace", "/__global__"]);
    let manifest: Vec<Value> = (0..200)
        .map(|i| {
            json!({"file_id": format!("file_{i}"), "object_key": format!("threads/{t}/files/f{i}.csv"),
                   "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                   "size_bytes": 10, "mount_path": format!("/workspace/f{i}.csv"), "read_only": false})
        })
        .collect();
    body["input_objects"] = json!(manifest);
    let created = d.ok(&t, "create_environment", body);
    let env = created["environment_id"].as_str().unwrap().to_string();
    d.ok(&t, "execute_command", json!({"environment_id": env, "command": "echo made > /workspace/out.txt"}));
    let done = d.ok(&t, "destroy_environment", json!({"environment_id": env}));
    let paths: Vec<&str> = done["artifacts"].as_array().unwrap().iter().filter_map(|a| a["path"].as_str()).collect();
    // Issue 24, item 6: the seed's default output path (/workspace) records what the job made.
    assert_eq!(paths, vec!["/workspace/out.txt"], "{done}");
}

fn required_env(name: &str) -> String {
    std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| {
        panic!("{name} is not set: run scripts/test.sh (or `eval \"$(bash scripts/garage.sh env)\"`)")
    })
}

/// Compute ledger entries of `env` in the daemon's wallet ledger.
fn charges_of(d: &Daemon, env: &str) -> usize {
    let ledger = d.admin(reqwest::Method::GET, &format!("/admin/accounts/{USER}/ledger"), None);
    ledger["entries"].as_array().unwrap().iter().filter(|e| e["source_id"] == env).count()
}

/// Issue 24, acceptance b: seed 003 §16.3's gateway smoke test, step by step, against a daemon on
/// Garage running a sandbox image with python, once with `[billing] mode = "settle"` (the daemon
/// charges; the gateway's `mark-settled` finds it done) and once with `mode = "report"` (the gateway
/// charges in its own ledger; the daemon only records and marks): in both, exactly one charge per
/// environment, counted across the daemon's ledger and the gateway's.
#[test]
fn the_seed_gateway_smoke_test_charges_each_environment_once_in_either_billing_mode() {
    for mode in ["settle", "report"] {
        let dir = tempfile::tempdir().unwrap();
        let prefix = format!("gateway-smoke/{}/", uid());
        let s3: Vec<(String, String)> = [
            ("SCOPEFS_S3_ENDPOINT", "SCOPEFS_TEST_S3_ENDPOINT"),
            ("SCOPEFS_S3_REGION", "SCOPEFS_TEST_S3_REGION"),
            ("SCOPEFS_S3_BUCKET", "SCOPEFS_TEST_S3_BUCKET"),
            ("SCOPEFS_S3_ACCESS_KEY_ID", "SCOPEFS_TEST_S3_ACCESS_KEY_ID"),
            ("SCOPEFS_S3_SECRET_ACCESS_KEY", "SCOPEFS_TEST_S3_SECRET_ACCESS_KEY"),
        ]
        .into_iter()
        .map(|(k, from)| (k.to_string(), required_env(from)))
        .chain([("SCOPEFS_S3_PREFIX".to_string(), prefix)])
        .collect();
        let env: Vec<(&str, &str)> = s3.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let extra = format!("{PRICING}\n[billing]\nmode = \"{mode}\"\n");
        let d = Daemon::start_with(dir.path(), python_image(), &extra, &env);
        let base = d.serve.base.clone();

        // 1-2. The S3 probe (the daemon does not start without it) and GET /ready 200.
        assert_eq!(d.client.get(format!("{base}/ready")).send().unwrap().status(), StatusCode::OK, "{mode}");
        let t = format!("thr_{}", uid());
        d.provision(&t);
        d.admin(reqwest::Method::PUT, &format!("/admin/accounts/{USER}/plan"), Some(json!({"plan": "metered"})));
        let credit = json!({"amount": "1.000000", "idempotency_key": format!("smoke-{mode}")});
        d.admin(reqwest::Method::POST, &format!("/admin/accounts/{USER}/credit"), Some(credit));

        // 3. A small CSV uploaded (the WebUI server's upload into the thread's files).
        let csv = b"name,score\nada,3\nbob,5\n".to_vec();
        let up = d
            .client
            .put(format!("{base}/api/workspace/file"))
            .query(&[("threadId", t.as_str()), ("path", "data.csv")])
            .bearer_auth(SERVICE_TOKEN)
            .body(csv.clone())
            .send()
            .unwrap();
        assert!(up.status().is_success(), "{mode}: upload {}", up.status());

        // 4. build_input_manifest: the object by its key in seed 003's layout.
        let manifest = json!([{
            "file_id": "file_1",
            "object_key": format!("threads/{t}/files/data.csv"),
            "sha256": sha256_hex(&csv),
            "size_bytes": csv.len(),
            "mount_path": "/workspace/data.csv",
            "read_only": true
        }]);
        // 5. create_environment, standard (a dedicated container; seed 003 §15 defaults).
        let mut body = seed_create_body(&d.image, &t);
        body["execution_mode"] = json!("standard");
        body["resource_class"] = json!("small");
        body["shared_compute_eligible"] = json!(false);
        body["input_objects"] = manifest;
        let created = d.ok(&t, "create_environment", body);
        assert_eq!(created["execution_mode"], "standard", "{mode}: {created}");
        let env = created["environment_id"].as_str().unwrap().to_string();

        // 6. python --version.
        let out = d.ok(&t, "execute_command", json!({"environment_id": env, "command": "python --version"}));
        let said = format!("{}{}", out["stdout"].as_str().unwrap_or(""), out["stderr"].as_str().unwrap_or(""));
        assert!(out["exit_code"] == 0 && said.starts_with("Python 3."), "{mode}: {out}");

        // 7. write/read: the file tools, and python reading the uploaded CSV.
        d.ok(&t, "write_file", json!({"path": "notes.txt", "content": "smoke"}));
        assert_eq!(d.ok(&t, "read_file", json!({"path": "notes.txt"}))["content"], "smoke", "{mode}");
        let count = "python -c \"import csv; print(sum(1 for _ in csv.DictReader(open('/workspace/data.csv'))))\"";
        let out = d.ok(&t, "execute_command", json!({"environment_id": env, "command": count}));
        assert_eq!(out["stdout"].as_str().map(str::trim), Some("2"), "{mode}: {out}");

        // 8. destroy persisting an artifact.
        let make = "mkdir -p /workspace/out && python -c \"import json; json.dump({'rows': 2}, open('/workspace/out/summary.json', 'w'))\"";
        let out = d.ok(&t, "execute_command", json!({"environment_id": env, "command": make}));
        assert_eq!(out["exit_code"], 0, "{mode}: {out}");
        let done = d.ok(&t, "destroy_environment", json!({"environment_id": env}));
        let arts = done["artifacts"].as_array().unwrap();
        assert_eq!(arts.len(), 1, "{mode}: {done}");
        assert_eq!(arts[0]["path"], "/workspace/out/summary.json");
        assert_eq!(arts[0]["object_key"], format!("threads/{t}/files/out/summary.json"));
        assert!(arts[0]["artifact_id"].as_str().is_some_and(|a| a.starts_with("art_")), "{mode}: {done}");

        // 9. register_artifacts, then the gateway marks them registered.
        let marked = json!({"environment_id": env});
        let marked = d.admin(reqwest::Method::POST, "/admin/mark-artifacts-registered", Some(marked));
        assert_eq!(marked["updated"], 1, "{mode}");

        // 10-11. settle_compute_usage + wallet_ledger, then mark-settled of the pending record.
        let pending = d.admin(reqwest::Method::POST, "/admin/pending-usage", Some(json!({"settled": 0})));
        let usage_id = pending["usage"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["environment_id"] == env.as_str())
            .and_then(|r| r["id"].as_i64())
            .unwrap_or_else(|| panic!("{mode}: no pending usage of {env}: {pending}"));
        // The gateway of `report` mode charges in its own ledger; in `settle` mode it leaves that to
        // the daemon (seed 003 §10.2 with one billing authority).
        let gateway_charges = usize::from(mode == "report");
        let mark = || {
            let r = d.admin(reqwest::Method::POST, "/admin/mark-settled", Some(json!({"usage_ids": [usage_id]})));
            r["results"][0]["status"].as_str().unwrap_or_default().to_string()
        };
        assert_eq!(mark(), "settled", "{mode}");
        assert_eq!(mark(), "already_settled", "{mode}: marked once");
        let daemon_charges = charges_of(&d, &env);
        assert_eq!(daemon_charges, usize::from(mode == "settle"), "{mode}: the daemon's ledger");
        assert_eq!(daemon_charges + gateway_charges, 1, "{mode}: exactly one charge for the environment");
        let still = d.admin(reqwest::Method::POST, "/admin/pending-usage", Some(json!({"settled": 0})));
        assert!(still["usage"].as_array().unwrap().iter().all(|r| r["id"] != usage_id), "{mode}: {still}");
        let settled = d.admin(reqwest::Method::POST, "/admin/pending-usage", Some(json!({"settled": 1})));
        assert!(settled["usage"].as_array().unwrap().iter().any(|r| r["id"] == usage_id), "{mode}: {settled}");

        // 12. With the execution service stopped, a compute call reaches nothing that could run it.
        drop(d);
        let after = Client::new().get(format!("{base}/ready")).timeout(Duration::from_secs(5)).send();
        assert!(after.is_err(), "{mode}: a stopped daemon still answered");
    }
}
