//! Acceptance d of issue 12 (seed 003 §5, §15): shared compute through the running daemon with
//! signed requests. Eligible small environments of two users run in per-user pools of warm
//! containers (the answer says `execution_mode: "simple"`, `backend_type: "shared_compute"`), a
//! container is reused by its own user and scope and never seen by the other user, ineligible
//! requests get dedicated containers (`standard`), a user's shared environments are bounded
//! (429), and a shared environment is billed exactly like a dedicated one. Needs root,
//! /dev/fuse, a Docker engine and `SCOPEFS_TEST_DOCKER_IMAGE` (scripts/docker.sh); without them
//! it fails.

pub mod compute_support;
pub mod serve_process;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use compute_support::{admin_call, compute_toml, docker_image as image, provision, signed_call, uid, Secrets};
use reqwest::blocking::Client;
use reqwest::StatusCode;
use serde_json::{json, Value};
use serve_process::{free_port, write_config as write_base_config, ServeProcess};

const SERVICE_TOKEN: &str = "shared-test-service-token-0123456789";
const HMAC_SECRET: &str = "shared-test-hmac-secret";
const ADMIN_TOKEN: &str = "shared-compute-admin-token";

/// `metered` pays every minute from cash, so a settlement shows the money.
const PRICING: &str = "[pricing]\ndefault_plan = \"pro\"\nsettle_interval_secs = 1\n\
    [pricing.plans.pro]\ncompute_allowed = true\nmonthly_minutes = 120\nhard_max_runtime_seconds = 7200\n\
    [pricing.plans.metered]\ncompute_allowed = true\nmonthly_minutes = 0\nhard_max_runtime_seconds = 7200\n";

fn write_config(dir: &Path, port: u16, deployment: &str, image: &str) -> PathBuf {
    let secrets = Secrets { service_token: SERVICE_TOKEN, hmac_secret: HMAC_SECRET, admin_token: Some(ADMIN_TOKEN) };
    let limits = "[limits]\nmax_shared_environments_per_user = 2\nshared_max_runtime_secs = 60\n\n";
    let rest = compute_toml(deployment, &secrets, image, &format!("{limits}{PRICING}"));
    write_base_config(dir, port, &rest)
}

struct Daemon {
    serve: ServeProcess,
    client: Client,
    deployment: String,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Daemon {
        let image = image();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let deployment = format!("sc-{}", &uid()[20..]);
        let cfg = write_config(dir.path(), port, &deployment, &image);
        let serve = ServeProcess::start(dir.path(), &cfg, port, &format!("daemon-{}.log", uid()), &[]);
        let mut d = Daemon {
            serve,
            client: Client::builder().timeout(Duration::from_secs(120)).build().unwrap(),
            deployment,
            _dir: dir,
        };
        d.serve.wait_ready(&d.client);
        d
    }

    fn provision(&self, user: &str, thread: &str) {
        provision(&self.client, &self.serve.base, SERVICE_TOKEN, thread, Some(user));
    }

    /// A signed `/tools/<tool>` call as `thread` of `user`.
    fn tool(&self, user: &str, thread: &str, tool: &str, params: Value) -> (StatusCode, Value) {
        signed_call(&self.client, &self.serve.base, HMAC_SECRET, (user, thread), tool, params, None)
    }

    fn ok(&self, user: &str, thread: &str, tool: &str, params: Value) -> Value {
        let (s, v) = self.tool(user, thread, tool, params);
        assert_eq!(s, StatusCode::OK, "{tool}: {v}\nlog:\n{}", self.serve.log_text());
        v
    }

    fn create(&self, user: &str, thread: &str, params: Value) -> (String, Value) {
        let v = self.ok(user, thread, "create_environment", params);
        (v["environment_id"].as_str().expect("environment_id").to_string(), v)
    }

    fn run(&self, user: &str, thread: &str, env: &str, command: &str) -> String {
        let out = self.ok(user, thread, "execute_command", json!({"environment_id": env, "command": command}));
        assert_eq!(out["exit_code"], 0, "{out}");
        out["stdout"].as_str().unwrap().to_string()
    }

    fn admin(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        admin_call(&self.client, (&self.serve.base, ADMIN_TOKEN), method, path, body)
    }

    /// Ids of the containers (running or not) of this daemon.
    fn containers(&self) -> Vec<String> {
        let label = format!("label=io.scopefs.deployment={}", self.deployment);
        let out = Command::new("docker").args(["ps", "-aq", "--no-trunc", "--filter", &label]).output().unwrap();
        String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        for c in self.containers() {
            let _ = Command::new("docker").args(["rm", "-f", &c]).output();
        }
    }
}

/// Writes this environment's markers (in `/workspace` and `/tmp`), then prints the container's
/// identity (the start time of its PID 1), `/tmp`, and every marker file it can find anywhere.
fn probe(user: &str, i: usize) -> String {
    format!(
        "echo {user} > /workspace/marker-{user}-{i}; echo {user} > /tmp/tmpmark-{user}-{i}; \
         echo START=$(cut -d' ' -f22 /proc/1/stat); echo TMP=$(ls -A /tmp); \
         find / \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -name '*mark*-*' -print 2>/dev/null; \
         cat /workspace/marker-* 2>/dev/null"
    )
}

/// Acceptance d: 20 eligible small environments of 2 users (2 threads each) run in the shared pool
/// with no cross-user visibility; containers are reused per user and scope and never across users;
/// `/tmp` comes back empty for the next environment; ineligible requests get dedicated containers;
/// a third live shared environment of a user is 429 while a dedicated one is still admitted.
#[test]
fn two_users_share_the_pool_without_seeing_each_other() {
    let d = Daemon::start();
    let users = ["alice", "bob"];
    let threads: HashMap<&str, Vec<String>> =
        users.iter().map(|u| (*u, (0..2).map(|k| format!("thr-{u}-{k}-{}", uid())).collect())).collect();
    for u in users {
        for t in &threads[u] {
            d.provision(u, t);
        }
    }
    let eligible = |i: usize| match i % 2 {
        0 => json!({"execution_mode": "simple", "max_runtime_seconds": 60, "resource_class": "shared-small"}),
        _ => json!({"shared_compute_eligible": true, "max_runtime_seconds": 60, "backend_policy": "auto"}),
    };
    let mut starts: HashMap<&str, BTreeSet<String>> = HashMap::new();
    for i in 0..5 {
        for k in 0..2 {
            for (me, other) in [("alice", "bob"), ("bob", "alice")] {
                let t = &threads[me][k];
                let n = i * 2 + k;
                let (env, created) = d.create(me, t, eligible(n));
                assert_eq!(
                    (&created["execution_mode"], &created["backend_type"]),
                    (&json!("simple"), &json!("shared_compute")),
                    "{created}"
                );
                assert!(created.get("container_id").is_none(), "{created}");
                let out = d.run(me, t, &env, &probe(me, n));
                assert!(!out.contains(other), "{me}'s environment {n} sees {other}: {out}");
                for th in &threads[other] {
                    assert!(!out.contains(th.as_str()), "{me} sees {other}'s thread: {out}");
                }
                let tmp = out.lines().find_map(|l| l.strip_prefix("TMP=")).expect("TMP line");
                assert_eq!(tmp, format!("tmpmark-{me}-{n}"), "/tmp of a reused container was not emptied: {out}");
                let markers: Vec<&str> = out.lines().filter(|l| l.starts_with('/')).collect();
                assert!(markers.contains(&format!("/workspace/marker-{me}-{n}").as_str()), "{out}");
                assert!(markers.iter().all(|m| m.contains(&format!("-{me}-"))), "foreign marker: {out}");
                let start = out.lines().find_map(|l| l.strip_prefix("START=")).expect("START line");
                starts.entry(me).or_default().insert(start.to_string());
                let done = d.ok(me, t, "destroy_environment", json!({"environment_id": env}));
                assert_eq!(done["execution_mode"], "simple", "{done}");
            }
        }
    }
    // One warm container per user and scope, reused by all of that scope's environments.
    assert_eq!(starts["alice"].len(), 2, "alice's containers: {:?}", starts["alice"]);
    assert_eq!(starts["bob"].len(), 2, "bob's containers: {:?}", starts["bob"]);
    assert!(starts["alice"].is_disjoint(&starts["bob"]), "a container served both users: {starts:?}");
    assert_eq!(d.containers().len(), 4, "only the warm containers are left");

    // Ineligible requests get dedicated containers, removed at destroy.
    let t = &threads["alice"][0];
    for params in [
        json!({}),
        json!({"execution_mode": "simple", "max_runtime_seconds": 300}),
        json!({"shared_compute_eligible": true, "max_runtime_seconds": 60, "resource_class": "gpu"}),
        json!({"execution_mode": "shared", "max_runtime_seconds": 60, "limits": {"max_stdout_stderr_bytes": 1 << 30}}),
    ] {
        let (env, created) = d.create("alice", t, params.clone());
        assert_eq!((&created["execution_mode"], &created["backend_type"]), (&json!("standard"), &json!("docker")));
        let out = d.run("alice", t, &env, "cut -d' ' -f22 /proc/1/stat");
        assert!(!starts["alice"].contains(out.trim()), "{params}: ran in a pooled container");
        assert_eq!(d.containers().len(), 5);
        d.ok("alice", t, "destroy_environment", json!({"environment_id": env}));
        assert_eq!(d.containers().len(), 4, "{params}: the dedicated container stays after destroy");
    }

    // At most two live shared environments per user (429 before anything runs); dedicated ones
    // and the other user are not affected.
    let (e1, _) = d.create("alice", &threads["alice"][0], eligible(0));
    let (e2, _) = d.create("alice", &threads["alice"][1], eligible(1));
    let (s, v) = d.tool("alice", &threads["alice"][0], "create_environment", eligible(0));
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
    let (e3, created) = d.create("alice", &threads["alice"][0], json!({}));
    assert_eq!(created["execution_mode"], "standard");
    let (e4, created) = d.create("bob", &threads["bob"][0], eligible(0));
    assert_eq!(created["execution_mode"], "simple");
    for (u, t, e) in [("alice", 0, e1), ("alice", 1, e2), ("alice", 0, e3), ("bob", 0, e4)] {
        d.ok(u, &threads[u][t], "destroy_environment", json!({"environment_id": e}));
    }
    let (_, created) = d.create("alice", &threads["alice"][0], eligible(0));
    assert_eq!(created["execution_mode"], "simple", "destroyed environments give their slots back");
}

/// Acceptance d, billing: a shared and a dedicated environment of the same user with the same
/// (sub-minute) runtime are settled identically: same minutes, plan, overtime and money.
#[test]
fn a_shared_environment_is_billed_like_a_dedicated_one() {
    let d = Daemon::start();
    let user = "payer";
    let t = format!("thr-pay-{}", uid());
    d.provision(user, &t);
    d.admin(reqwest::Method::PUT, &format!("/admin/accounts/{user}/plan"), Some(json!({"plan": "metered"})));
    d.admin(
        reqwest::Method::POST,
        &format!("/admin/accounts/{user}/credit"),
        Some(json!({"amount": "1.000000", "idempotency_key": "shared-billing"})),
    );
    let (shared, created) = d.create(user, &t, json!({"execution_mode": "simple", "max_runtime_seconds": 60}));
    assert_eq!(created["execution_mode"], "simple", "{created}");
    let (dedicated, created) = d.create(user, &t, json!({"max_runtime_seconds": 60}));
    assert_eq!(created["execution_mode"], "standard", "{created}");
    for env in [&shared, &dedicated] {
        assert_eq!(d.run(user, &t, env, "echo billed"), "billed\n");
        d.ok(user, &t, "destroy_environment", json!({"environment_id": env}));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let settled = loop {
        let all = d.admin(reqwest::Method::POST, "/admin/pending-usage", Some(json!({"settled": 1, "limit": 500})));
        let rows: Vec<Value> = all["usage"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|u| u["environment_id"] == json!(shared) || u["environment_id"] == json!(dedicated))
            .cloned()
            .collect();
        if rows.len() == 2 {
            break rows;
        }
        assert!(Instant::now() < deadline, "both usages were not settled: {all}");
        std::thread::sleep(Duration::from_millis(250));
    };
    for k in ["compute_minutes", "plan", "free_minutes", "overtime_minutes", "overtime_charged", "settlement_status"] {
        assert_eq!(settled[0][k], settled[1][k], "{k} differs: {settled:?}");
    }
    assert_eq!(settled[0]["compute_minutes"], 1, "{settled:?}");
    let acct = d.admin(reqwest::Method::GET, &format!("/admin/accounts/{user}"), None);
    assert_eq!(acct["cash_balance"], "0.900000", "two minutes at 0.05 each: {acct}");
}
