//! A `scopefs serve` with the Docker executor and its signed and admin clients, for the compute
//! tests of `tools_compute`: its configuration (local store, `pro` and `metered` plans), the
//! deployment's containers, and bounded polling.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use reqwest::StatusCode;
use serde_json::Value;

use super::{admin_call, docker_image, provision, signed_call, uid};
use crate::serve_process::{free_port, write_config as write_base_config, ServeProcess};

pub const SERVICE_TOKEN: &str = "compute-test-service-token-0123456789";
pub const HMAC_SECRET: &str = "compute-test-hmac-secret";
pub const ADMIN_TOKEN: &str = "tools-compute-admin-token";

/// New accounts get `pro` (free minutes); `metered` has none, so compute is paid from cash.
const PRICING: &str = "[pricing]\ndefault_plan = \"pro\"\nsettle_interval_secs = 1\n\
    [pricing.plans.pro]\ncompute_allowed = true\nmonthly_minutes = 120\nhard_max_runtime_seconds = 7200\n\
    [pricing.plans.metered]\ncompute_allowed = true\nmonthly_minutes = 0\nhard_max_runtime_seconds = 7200\n";

/// A config for a local-store daemon; `executor` is the body of its `[executor]` section.
pub fn write_config(dir: &Path, port: u16, deployment: &str, executor: &str) -> PathBuf {
    let rest = format!(
        "deployment_id = {deployment:?}\nservice_token = {SERVICE_TOKEN:?}\nhmac_secret = {HMAC_SECRET:?}\n\
         admin_token = {ADMIN_TOKEN:?}\n\n[store]\nkind = \"local\"\n\n[executor]\n{executor}\n{PRICING}",
    );
    write_base_config(dir, port, &rest)
}

/// The `[executor]` section of the test image with the tests' runtime and command bounds.
pub fn executor_section(image: &str) -> String {
    format!("image = {image:?}\nmax_runtime_secs = 600\ncommand_timeout_secs = 30\n")
}

/// A ready `scopefs serve` with its client (the process: [`ServeProcess`]).
pub struct Daemon {
    pub serve: ServeProcess,
    pub client: Client,
}

impl Daemon {
    pub fn start(dir: &Path, config: &Path, port: u16) -> Daemon {
        Self::start_with_env(dir, config, port, &[])
    }

    pub fn start_with_env(dir: &Path, config: &Path, port: u16, env: &[(&str, &str)]) -> Daemon {
        let serve = ServeProcess::start(dir, config, port, &format!("daemon-{}.log", uid()), env);
        let mut d = Daemon { serve, client: Client::builder().timeout(Duration::from_secs(120)).build().unwrap() };
        d.serve.wait_ready(&d.client);
        d
    }

    pub fn provision(&self, thread: &str) -> String {
        provision(&self.client, &self.serve.base, SERVICE_TOKEN, thread, None)
    }

    /// A signed `/tools/<tool>` call as `thread`.
    pub fn tool(&self, thread: &str, tool: &str, params: Value) -> (StatusCode, Value) {
        self.tool_as("user-1", thread, tool, params)
    }

    /// A signed `/tools/<tool>` call as `thread` of user `user`.
    pub fn tool_as(&self, user: &str, thread: &str, tool: &str, params: Value) -> (StatusCode, Value) {
        signed_call(&self.client, &self.serve.base, HMAC_SECRET, (user, thread), tool, params, None)
    }

    pub fn ok(&self, thread: &str, tool: &str, params: Value) -> Value {
        let (s, v) = self.tool(thread, tool, params);
        assert_eq!(s, StatusCode::OK, "{tool}: {v}\nlog:\n{}", self.serve.log_text());
        v
    }

    pub fn admin(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        admin_call(&self.client, (&self.serve.base, ADMIN_TOKEN), method, path, body)
    }

    /// `user-1`'s account.
    pub fn account(&self) -> Value {
        self.admin(reqwest::Method::GET, "/admin/accounts/user-1", None)
    }
}

/// Ids of the containers labelled with `deployment`: all of them, or only running ones.
fn containers(deployment: &str, all: bool) -> Vec<String> {
    let filter = format!("label=io.scopefs.deployment={deployment}");
    let mut args = vec!["ps", "-q", "--no-trunc", "--filter", &filter];
    if all {
        args.push("-a");
    }
    let out = Command::new("docker").args(&args).output().unwrap();
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

/// Ids of the containers (running or not) labelled with `deployment`.
pub fn containers_of(deployment: &str) -> Vec<String> {
    containers(deployment, true)
}

/// Ids of the running containers labelled with `deployment`.
pub fn running_containers_of(deployment: &str) -> Vec<String> {
    containers(deployment, false)
}

pub fn remove_containers(deployment: &str) {
    for c in containers_of(deployment) {
        let _ = Command::new("docker").args(["rm", "-f", &c]).output();
    }
}

/// A fresh data directory, port and deployment id, and the configuration of a daemon running the
/// test image there, for daemons started (and started again) on it.
pub struct Setup {
    pub image: String,
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub deployment: String,
    pub config: PathBuf,
}

impl Setup {
    /// `extra` is appended after the `[executor]` section (e.g. a `[limits]` section).
    pub fn new(extra: &str) -> Setup {
        let image = docker_image();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let deployment = format!("ct-{}", &uid()[20..]);
        let config = write_config(dir.path(), port, &deployment, &format!("{}{extra}", executor_section(&image)));
        Setup { image, dir, port, deployment, config }
    }

    /// A daemon started on this setup, ready.
    pub fn start(&self) -> Daemon {
        self.start_with_env(&[])
    }

    /// [`Setup::start`] with extra environment variables.
    pub fn start_with_env(&self, env: &[(&str, &str)]) -> Daemon {
        Daemon::start_with_env(self.dir.path(), &self.config, self.port, env)
    }
}

/// A daemon with the test executor on a fresh data directory: its directory (kept alive by the
/// caller), the daemon and its deployment id.
pub fn daemon_with_executor() -> (tempfile::TempDir, Daemon, String) {
    let setup = Setup::new("");
    let d = setup.start();
    (setup.dir, d, setup.deployment)
}

/// Polls `f` every 200 ms until it holds; fails after 20 s.
pub fn wait_until(what: &str, f: impl FnMut() -> bool) {
    wait_long(what, Duration::from_secs(20), f)
}

/// Polls `f` every 200 ms until it holds; fails after `limit`.
pub fn wait_long(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
