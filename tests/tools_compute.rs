//! The compute tools through the running daemon with signed requests (acceptance d, e, f, g):
//! per-scope environments and processes, `kill -9` + restart reconciliation, Docker unreachable
//! (503 and nothing runs on the host), and strict mode refusing weak configurations. Needs root,
//! /dev/fuse, a Docker engine and `SCOPEFS_TEST_DOCKER_IMAGE`; without them it fails.

pub mod compute_support;
pub mod serve_process;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use compute_support::daemon::{
    containers_of, daemon_with_executor, remove_containers, running_containers_of, wait_long, wait_until, write_config,
    Daemon, Setup, SERVICE_TOKEN,
};
use compute_support::{docker_image as image, uid};
use reqwest::StatusCode;
use serde_json::{json, Value};
use serve_process::{free_port, BIN};

fn image_id(image: &str) -> String {
    let out = Command::new("docker").args(["image", "inspect", "--format", "{{.Id}}", image]).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `scopefs_refused_total{kind="cross_scope",via="api"}` from the daemon's `/metrics`.
fn cross_scope_refusals(d: &Daemon) -> u64 {
    let resp = d.client.get(format!("{}/metrics", d.serve.base)).bearer_auth(SERVICE_TOKEN).send().unwrap();
    let text = resp.text().unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("scopefs_refused_total{kind=\"cross_scope\",via=\"api\"} "))
        .unwrap_or_else(|| panic!("no cross-scope sample in /metrics:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn environments_and_processes_are_per_scope() {
    let (dir, d, deployment) = daemon_with_executor();
    let (ta, tb) = (format!("thread-a-{}", uid()), format!("thread-b-{}", uid()));
    let scope_a = d.provision(&ta);
    d.provision(&tb);

    let env = d.ok(&ta, "create_environment", json!({"max_runtime_seconds": 300}));
    let env_id = env["environment_id"].as_str().unwrap().to_string();
    assert_eq!(env["state"], "running");
    assert_eq!(env["effective_max_runtime_seconds"], 300);
    assert!(env.get("container_id").is_none(), "container id leaked: {env}");
    let out = d.ok(
        &ta,
        "execute_command",
        json!({"environment_id": env_id, "command": "echo hi; echo x > /workspace/made-in-sandbox"}),
    );
    assert_eq!((out["stdout"].as_str(), out["exit_code"].as_i64()), (Some("hi\n"), Some(0)), "{out}");
    let secret = format!("secret-of-a-{}", uid());
    let p =
        d.ok(&ta, "start_process", json!({"environment_id": env_id, "command": format!("echo {secret}; sleep 300")}));
    let pid = p["process_id"].as_str().unwrap().to_string();
    assert_eq!(p["state"], "running");
    wait_until("the process log", || {
        d.ok(&ta, "check_process", json!({"process_id": pid}))["log_tail"].as_str().unwrap_or("").contains(&secret)
    });

    // The log lives in the runtime area, not in the workspace.
    let log = dir.path().join("data/runtime").join(&scope_a).join("processes").join(format!("{pid}.log"));
    assert!(std::fs::read_to_string(&log).unwrap().contains(&secret));
    let listed = d.ok(&ta, "list_dir", json!({"path": "/workspace"})).to_string();
    assert!(listed.contains("made-in-sandbox") && !listed.contains(".log"), "{listed}");

    // B sees none of A's, and every id of A is 404 (each counted as a cross-scope attempt; an
    // unknown id is 404 too but is no such attempt).
    let cross0 = cross_scope_refusals(&d);
    let (s, _) = d.tool(&tb, "get_environment_status", json!({"environment_id": format!("env-{}", uid())}));
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(cross_scope_refusals(&d), cross0, "an unknown id counted as cross-scope");
    assert_eq!(d.ok(&tb, "list_environments", json!({}))["environments"], json!([]));
    assert_eq!(d.ok(&tb, "list_processes", json!({}))["processes"], json!([]));
    for (tool, params) in [
        ("get_environment_status", json!({"environment_id": env_id})),
        ("execute_command", json!({"environment_id": env_id, "command": "echo pwned"})),
        ("destroy_environment", json!({"environment_id": env_id})),
        ("start_process", json!({"environment_id": env_id, "command": "echo pwned"})),
        ("check_process", json!({"process_id": pid})),
        ("stop_process", json!({"process_id": pid})),
        ("list_processes", json!({"environment_id": env_id})),
    ] {
        let (s, v) = d.tool(&tb, tool, params);
        assert_eq!(s, StatusCode::NOT_FOUND, "{tool} from B: {v}");
        assert!(!v.to_string().contains(&secret), "{tool} leaked A's log: {v}");
    }
    assert_eq!(cross_scope_refusals(&d), cross0 + 7, "every id of A named by B is counted");
    assert_eq!(d.ok(&ta, "list_environments", json!({}))["environments"].as_array().unwrap().len(), 1);
    assert_eq!(d.ok(&ta, "list_processes", json!({}))["processes"].as_array().unwrap().len(), 1);

    // A stops its process and destroys its environment; twice is harmless.
    let stopped = d.ok(&ta, "stop_process", json!({"process_id": pid}));
    assert_eq!(stopped["state"], "stopped");
    let gone = d.ok(&ta, "destroy_environment", json!({"environment_id": env_id}));
    assert_eq!(
        (gone["state"].as_str(), gone["end_reason"].as_str(), gone["already_ended"].as_bool()),
        (Some("ended"), Some("destroyed"), Some(false))
    );
    assert!(gone["runtime_seconds"].as_u64().is_some());
    let again = d.ok(&ta, "destroy_environment", json!({"environment_id": env_id}));
    assert_eq!(
        (again["already_ended"].as_bool(), again["runtime_seconds"].clone()),
        (Some(true), gone["runtime_seconds"].clone())
    );
    assert!(containers_of(&deployment).is_empty(), "containers left after destroy");
    let (s, _) = d.tool(&ta, "execute_command", json!({"environment_id": env_id, "command": "true"}));
    assert_eq!(s, StatusCode::CONFLICT, "exec in an ended environment");
}

#[test]
fn kill9_and_restart_leave_nothing_unknown_running() {
    let setup = Setup::new("");
    let (image, deployment) = (setup.image.as_str(), setup.deployment.clone());
    // The registry clock of both daemons; the restart happens 90 s later on it (within the
    // signature window, below the environment's 600 s maximum).
    let clock = setup.dir.path().join("clock-offset");
    let clock_env = [("SCOPEFS_TEST_CLOCK_FILE", clock.to_str().unwrap())];
    let mut d = setup.start_with_env(&clock_env);
    let ta = format!("thread-a-{}", uid());
    d.provision(&ta);
    let env_id = d.ok(&ta, "create_environment", json!({}))["environment_id"].as_str().unwrap().to_string();
    let pid = d.ok(&ta, "start_process", json!({"command": "sleep 600"}))["process_id"].as_str().unwrap().to_string();
    d.serve.kill9();
    assert_eq!(containers_of(&deployment).len(), 1, "the environment's container outlives the daemon");
    // A container the registry never knew, carrying the deployment's label.
    let rogue = Command::new("docker")
        .args(["run", "-d", "--network", "none", "--label", &format!("io.scopefs.deployment={deployment}")])
        .args(["--label", "io.scopefs.environment=env_unknown", image, "sleep", "600"])
        .output()
        .unwrap();
    assert!(rogue.status.success(), "starting a rogue container");

    std::fs::write(&clock, "90").unwrap();
    let d = setup.start_with_env(&clock_env);
    assert_eq!(containers_of(&deployment), Vec::<String>::new(), "containers survive the restart");
    let env = d.ok(&ta, "get_environment_status", json!({"environment_id": env_id}));
    assert_eq!((env["state"].as_str(), env["end_reason"].as_str()), (Some("ended"), Some("daemon_restart")), "{env}");
    // Runtime is recorded up to the restart: at least the 90 s the clock moved in between.
    assert!(env["runtime_seconds"].as_u64().is_some_and(|s| (90..600).contains(&s)), "runtime recorded: {env}");
    let p = d.ok(&ta, "check_process", json!({"process_id": pid}));
    assert_eq!(p["state"], "lost", "{p}");
    // Compute works again after the restart.
    let env2 = d.ok(&ta, "create_environment", json!({}))["environment_id"].as_str().unwrap().to_string();
    assert_eq!(
        d.ok(&ta, "execute_command", json!({"environment_id": env2, "command": "ls /workspace >/dev/null && echo ok"}))
            ["stdout"],
        "ok\n"
    );
    d.ok(&ta, "destroy_environment", json!({"environment_id": env2}));
    remove_containers(&deployment);
}

#[test]
fn docker_unreachable_file_tools_work_compute_is_503_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let sock = dir.path().join("no-such-docker.sock");
    let cfg = write_config(dir.path(), port, "ct-nodocker", &format!("docker_host = {:?}\n", sock.to_string_lossy()));
    let d = Daemon::start(dir.path(), &cfg, port);
    let ta = format!("thread-a-{}", uid());
    d.provision(&ta);
    d.ok(&ta, "write_file", json!({"path": "/workspace/notes.txt", "content": "still works"}));
    assert_eq!(d.ok(&ta, "read_file", json!({"path": "notes.txt"}))["content"], "still works");

    let marker = PathBuf::from(format!("/tmp/marker-{}", uid()));
    let touch = format!("touch {}", marker.display());
    for (tool, params) in [
        ("create_environment", json!({})),
        ("list_environments", json!({})),
        ("execute_command", json!({"environment_id": "env_x", "command": touch})),
        ("start_process", json!({"command": touch})),
        ("get_environment_status", json!({"environment_id": "env_x"})),
        ("destroy_environment", json!({"environment_id": "env_x"})),
        ("check_process", json!({"process_id": "proc_x"})),
        ("stop_process", json!({"process_id": "proc_x"})),
        ("list_processes", json!({})),
    ] {
        let (s, v) = d.tool(&ta, tool, params);
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("compute_unavailable")),
            "{tool}: {v}"
        );
    }
    // Every call above was answered (503) before this check, and without an executor nothing
    // runs later: a command that ran would have left its marker by now.
    assert!(!marker.exists(), "a command ran on the host");
    assert!(!d.serve.mount_root.join("marker").exists());
}

/// Runs `scopefs serve` with a strict config and returns (exit success, stderr).
fn strict_serve(executor: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        port,
        &format!("ct-{}", &uid()[20..]),
        &format!("isolation = \"required\"\n{executor}"),
    );
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(&cfg)
        .arg("serve")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (status.success(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return (true, "still running".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn strict_mode_refuses_each_weak_configuration() {
    let image = image();
    let pinned = image_id(&image);
    assert!(pinned.starts_with("sha256:"), "image id {pinned}");
    let missing = format!("sandbox@sha256:{}", "0".repeat(64));
    let cases = [
        (format!("image = {image:?}\n"), "executor.image"),
        (format!("image = {pinned:?}\nnetwork = \"bridge\"\n"), "executor.network"),
        (format!("image = {pinned:?}\nuser = \"0:0\"\n"), "executor.user"),
        (format!("image = {pinned:?}\nuser = \"root\"\n"), "executor.user"),
        (format!("image = {pinned:?}\nmemory_bytes = 0\n"), "executor.memory_bytes"),
        (format!("image = {pinned:?}\nnano_cpus = 0\n"), "executor.nano_cpus"),
        (format!("image = {pinned:?}\npids_limit = 0\n"), "executor.pids_limit"),
        (format!("image = {pinned:?}\ntmp_bytes = 0\n"), "executor.tmp_bytes"),
        (format!("image = {pinned:?}\ndocker_host = \"/nonexistent/docker.sock\"\n"), "reachable Docker engine"),
        (format!("image = {missing:?}\n"), "executor.image"),
        (format!("image = {pinned:?}\nnetwork = \"host\"\n"), "executor.network"),
    ];
    for (section, needle) in cases {
        let (ok, err) = strict_serve(&section);
        assert!(!ok, "strict mode started with:\n{section}");
        assert!(err.contains(needle), "stderr for\n{section}does not name {needle:?}:\n{err}");
    }
    // The full policy with a pinned image starts, and runs commands.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let deployment = format!("ct-{}", &uid()[20..]);
    let cfg = write_config(dir.path(), port, &deployment, &format!("isolation = \"required\"\nimage = {pinned:?}\n"));
    let d = Daemon::start(dir.path(), &cfg, port);
    let t = format!("thread-s-{}", uid());
    d.provision(&t);
    let env = d.ok(&t, "create_environment", json!({}))["environment_id"].as_str().unwrap().to_string();
    assert_eq!(
        d.ok(&t, "execute_command", json!({"environment_id": env, "command": "id -u"}))["stdout"],
        "2000000000\n"
    );
    d.ok(&t, "destroy_environment", json!({"environment_id": env}));
    remove_containers(&deployment);
}

#[test]
fn a_container_killed_behind_the_daemons_back_is_recorded_as_ended() {
    let (_dir, d, deployment) = daemon_with_executor();
    let t = format!("thread-r-{}", uid());
    d.provision(&t);
    let other = d.ok(&t, "create_environment", json!({}))["environment_id"].as_str().unwrap().to_string();
    // (The max-runtime stop is covered by the one-minute billing test below: the preflight
    // refuses any environment whose effective max runtime is under 60 s.)
    // A container killed behind the daemon's back is recorded as ended, not left "running".
    let ids = containers_of(&deployment);
    assert_eq!(ids.len(), 1, "one environment, one container");
    assert!(Command::new("docker").args(["kill", &ids[0]]).output().unwrap().status.success());
    wait_until("the death of the container", || {
        d.ok(&t, "get_environment_status", json!({"environment_id": other}))["state"] == "ended"
    });
    let env = d.ok(&t, "get_environment_status", json!({"environment_id": other}));
    assert_eq!(env["end_reason"], "container_exited", "{env}");
    remove_containers(&deployment);
}

/// Acceptance f of the billing issue, first half: an environment used through signed tools is
/// settled from the plan's free minutes: one minute, no cash, one ledger row with the compute key.
#[test]
fn signed_compute_is_settled_from_free_minutes() {
    let (_dir, d, deployment) = daemon_with_executor();
    let t = format!("thread-f-{}", uid());
    d.provision(&t);
    let env = d.ok(&t, "create_environment", json!({}))["environment_id"].as_str().unwrap().to_string();
    let out = d.ok(&t, "execute_command", json!({"environment_id": env, "command": "echo billed"}));
    assert_eq!(out["stdout"], "billed\n", "{out}");
    d.ok(&t, "destroy_environment", json!({"environment_id": env}));
    wait_until("settlement of the environment", || d.account()["compute_minutes_used"] == 1);
    let acct = d.account();
    assert_eq!(acct["compute_minutes_remaining"], 119, "{acct}");
    assert_eq!(acct["cash_balance"], "0.000000", "{acct}");
    let ledger = d.admin(reqwest::Method::GET, "/admin/accounts/user-1/ledger", None).to_string();
    assert!(ledger.contains(&format!("compute:user-1:{t}:{env}")), "{ledger}");
    remove_containers(&deployment);
}

/// Second half: an account that can afford exactly one minute (no free minutes, cash for one
/// overtime minute) gets an environment limited to 60 s, which is stopped at its max runtime and
/// charged that one minute, leaving the balance at zero.
#[test]
fn an_account_that_affords_one_minute_is_stopped_after_a_minute_and_charged() {
    let (_dir, d, deployment) = daemon_with_executor();
    let t = format!("thread-m-{}", uid());
    d.provision(&t);
    d.admin(reqwest::Method::PUT, "/admin/accounts/user-1/plan", Some(json!({"plan": "metered"})));
    d.admin(
        reqwest::Method::POST,
        "/admin/accounts/user-1/credit",
        Some(json!({"amount": "0.050000", "idempotency_key": "one-minute"})),
    );
    let created = d.ok(&t, "create_environment", json!({}));
    assert_eq!(created["effective_max_runtime_seconds"], 60, "{created}");
    let env = created["environment_id"].as_str().unwrap().to_string();
    let started = Instant::now();
    wait_long("the one-minute stop", Duration::from_secs(120), || {
        d.ok(&t, "get_environment_status", json!({"environment_id": env}))["state"] == "ended"
    });
    assert!(started.elapsed() >= Duration::from_secs(55), "stopped too early: {:?}", started.elapsed());
    let status = d.ok(&t, "get_environment_status", json!({"environment_id": env}));
    assert_eq!(status["end_reason"], "max_runtime", "{status}");
    wait_until("settlement of the minute", || d.account()["cash_balance"] == "0.000000");
    let acct = d.account();
    assert_eq!(acct["compute_minutes_remaining"], 0, "{acct}");
    // Nothing left to pay with: the next environment is refused by the preflight.
    let (s, v) = d.tool(&t, "create_environment", json!({}));
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["error"]["code"], "compute_quota_exceeded", "{v}");
    remove_containers(&deployment);
}

/// Review M4 and L12: a memory worker of a scope runs nothing in the primary thread's read-write
/// environment and ends none of it or its processes, but uses a read-only environment of its own;
/// another user cannot act in the scope at all.
#[test]
fn memory_workers_use_only_their_own_read_only_environments() {
    let (_dir, d, _deployment) = daemon_with_executor();
    let primary = format!("thread-a-{}", uid());
    let scope = d.provision(&primary);
    let worker = format!("mw-{}", uid());
    let resp = d
        .client
        .post(format!("{}/internal/workspace-scopes/{scope}/owners", d.serve.base))
        .bearer_auth(SERVICE_TOKEN)
        .json(&json!({"owner_type": "memory_worker", "resource_id": worker}))
        .send()
        .unwrap();
    assert!(resp.status().is_success(), "owner: {}", resp.status());

    let rw = d.ok(&primary, "create_environment", json!({}))["environment_id"].as_str().unwrap().to_string();
    let pid = d.ok(&primary, "start_process", json!({"environment_id": rw, "command": "sleep 300"}))["process_id"]
        .as_str()
        .unwrap()
        .to_string();
    let refused = |tool: &str, params: Value, code: &str| {
        let (s, v) = d.tool(&worker, tool, params);
        assert_eq!((s, v["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some(code)), "{tool}: {v}");
    };
    refused("execute_command", json!({"environment_id": rw, "command": "echo pwned > /workspace/pwned"}), "read_only");
    refused("start_process", json!({"environment_id": rw, "command": "echo pwned > /workspace/pwned"}), "read_only");
    refused("start_process", json!({"command": "echo pwned > /workspace/pwned"}), "read_only");
    refused("destroy_environment", json!({"environment_id": rw}), "not_owner");
    refused("stop_process", json!({"process_id": pid}), "not_owner");
    let (s, _) = d.tool(&primary, "read_file", json!({"path": "pwned"}));
    assert_eq!(s, StatusCode::NOT_FOUND, "the worker wrote through the primary's environment");
    assert_eq!(d.ok(&primary, "get_environment_status", json!({"environment_id": rw}))["state"], "running");

    // Its own environment is read-only and usable; the primary cannot end it.
    let ro = d.ok(&worker, "create_environment", json!({}));
    assert_eq!(ro["read_only"], true, "{ro}");
    let ro = ro["environment_id"].as_str().unwrap().to_string();
    let out = d.ok(&worker, "execute_command", json!({"environment_id": ro, "command": "echo from-worker"}));
    assert_eq!(out["stdout"], "from-worker\n", "{out}");
    let (s, v) = d.tool(&primary, "destroy_environment", json!({"environment_id": ro}));
    assert_eq!((s, v["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("not_owner")), "{v}");

    // The scope belongs to user-1 (its first signed request): another user acting through the
    // primary thread is answered like an unknown thread (seed 003 §3.7, issue 12).
    let (s, v) = d.tool_as("user-2", &primary, "list_environments", json!({}));
    assert_eq!((s, v["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("scope_not_found")), "{v}");
    let mine = d.ok(&primary, "list_environments", json!({}));
    assert!(mine["environments"].as_array().unwrap().iter().all(|e| e["user_id"] == "user-1"), "{mine}");

    d.ok(&worker, "destroy_environment", json!({"environment_id": ro}));
    d.ok(&primary, "stop_process", json!({"process_id": pid}));
    d.ok(&primary, "destroy_environment", json!({"environment_id": rw}));
}

/// Review M3 and M8 through the daemon: a scope runs at most `max_concurrent_execs_per_scope`
/// commands and `max_live_processes_per_scope` background processes at once; beyond is 429
/// before anything runs, and a finished one frees its place.
#[test]
fn concurrent_commands_and_live_processes_are_capped_per_scope() {
    let setup = Setup::new("\n[limits]\nmax_concurrent_execs_per_scope = 1\nmax_live_processes_per_scope = 1\n");
    let (d, deployment) = (setup.start(), setup.deployment.clone());
    let t = format!("thread-l-{}", uid());
    d.provision(&t);
    let env = d.ok(&t, "create_environment", json!({}))["environment_id"].as_str().unwrap().to_string();
    let refused = |(status, body): (StatusCode, Value)| {
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert_eq!(body["error"]["code"], "compute_capacity_exceeded");
    };
    let waits = "touch /workspace/started; while [ ! -e /workspace/go ]; do sleep 0.1; done; echo done";
    std::thread::scope(|s| {
        let first = s.spawn(|| d.tool(&t, "execute_command", json!({"environment_id": env, "command": waits})));
        wait_until("the first command to run", || d.tool(&t, "read_file", json!({"path": "started"})).0.is_success());
        refused(d.tool(&t, "execute_command", json!({"environment_id": env, "command": "touch /workspace/second"})));
        d.ok(&t, "write_file", json!({"path": "go", "content": ""}));
        let (status, out) = first.join().unwrap();
        assert_eq!((status, out["stdout"].as_str()), (StatusCode::OK, Some("done\n")), "{out}");
    });
    assert_eq!(d.tool(&t, "read_file", json!({"path": "second"})).0, StatusCode::NOT_FOUND, "the refused command ran");
    assert_eq!(
        d.ok(&t, "execute_command", json!({"environment_id": env, "command": "echo again"}))["stdout"],
        "again\n"
    );

    let start = json!({"environment_id": env, "command": "sleep 300"});
    let pid = d.ok(&t, "start_process", start.clone())["process_id"].as_str().unwrap().to_string();
    refused(d.tool(&t, "start_process", start.clone()));
    d.ok(&t, "stop_process", json!({"process_id": pid}));
    d.ok(&t, "start_process", start);
    d.ok(&t, "destroy_environment", json!({"environment_id": env}));
    remove_containers(&deployment);
}

/// Issue 9 item 3 acceptance: a container appending `date` to `/workspace/log` every 0.1 s (and
/// writing through a descriptor held open on `/workspace/held`) keeps running through a graceful
/// restart (SIGHUP to the supervisor) and a `kill -9` of the worker that serves the mounts and
/// the API: its environment is adopted, not ended, it never sees an error (no `ENOTCONN`), and
/// every line written before each restart is still in the file afterwards.
#[test]
fn a_container_keeps_its_workspace_through_a_restart_and_a_killed_worker() {
    let (dir, mut d, deployment) = daemon_with_executor();
    let ta = format!("thread-r-{}", uid());
    let scope = d.provision(&ta);
    let env_id = d.ok(&ta, "create_environment", json!({}))["environment_id"].as_str().unwrap().to_string();
    let looped = "exec 3>>/workspace/held; while true; do date >> /workspace/log 2>>/tmp/errors || echo \"log: $?\" >> /tmp/errors; date >&3 2>>/tmp/errors || echo \"held: $?\" >> /tmp/errors; sleep 0.1; done";
    d.ok(&ta, "start_process", json!({"environment_id": env_id, "command": looped}));
    let log = dir.path().join("mnt").join(&scope).join("log");
    let count = |p: &Path| std::fs::read_to_string(p).unwrap_or_default().lines().count();
    let grow = |from: usize| wait_until("the container's loop to write on", || count(&log) >= from + 5);
    grow(0);

    let first = d.serve.worker(None);
    let before_graceful = std::fs::read_to_string(&log).unwrap();
    // SAFETY: kill(2) on our child's pid (the supervisor).
    assert_eq!(unsafe { libc::kill(d.serve.supervisor_pid() as i32, libc::SIGHUP) }, 0);
    let second = d.serve.worker(Some(first));
    d.serve.wait_ready(&d.client);
    grow(count(&log));

    let before_kill = std::fs::read_to_string(&log).unwrap();
    // SAFETY: kill(2) on the supervisor's child, which this test started.
    assert_eq!(unsafe { libc::kill(second as i32, libc::SIGKILL) }, 0);
    d.serve.worker(Some(second));
    d.serve.wait_ready(&d.client);
    grow(count(&log));

    let after = std::fs::read_to_string(&log).unwrap();
    assert!(
        after.starts_with(&before_graceful) && after.starts_with(&before_kill),
        "lines written before a restart are gone"
    );
    let env = d.ok(&ta, "get_environment_status", json!({"environment_id": env_id}));
    assert_eq!(env["state"].as_str(), Some("running"), "the environment was not adopted: {env}");
    assert_eq!(containers_of(&deployment).len(), 1, "the container did not survive");
    let errors = d.ok(
        &ta,
        "execute_command",
        json!({"environment_id": env_id, "command": "cat /tmp/errors 2>/dev/null; echo end"}),
    );
    assert_eq!(errors["stdout"].as_str(), Some("end\n"), "the loop saw errors: {errors}");
    let held = d.ok(&ta, "execute_command", json!({"environment_id": env_id, "command": "wc -l < /workspace/held"}));
    assert!(held["stdout"].as_str().unwrap_or("0").trim().parse::<usize>().unwrap_or(0) >= count(&log) / 2, "{held}");
    d.ok(&ta, "destroy_environment", json!({"environment_id": env_id}));
    remove_containers(&deployment);
}

/// How the worker serving the mounts is replaced while an environment runs.
#[derive(Clone, Copy, Debug)]
enum Restart {
    /// SIGHUP to the supervisor: the worker hands over and a new one adopts the mounts.
    Graceful,
    /// `kill -9` of the worker: the supervisor starts a new one on the kept mounts.
    KilledWorker,
}

/// Issue 22 acceptance d: an environment admitted for 60 s (a process writing into its workspace)
/// is adopted by the next worker after `restart` and stopped by it at 60 s (±2 s) from its
/// creation, billed 60 s (one of the plan's free minutes), its container gone.
fn an_environment_keeps_its_admitted_runtime_through(restart: Restart) {
    let (_dir, d, deployment) = daemon_with_executor();
    let mut d = d;
    let t = format!("thread-rt-{}", uid());
    d.provision(&t);
    let created = d.ok(&t, "create_environment", json!({"max_runtime_seconds": 60}));
    let admitted = Instant::now();
    assert_eq!(created["effective_max_runtime_seconds"], 60, "{created}");
    let env = created["environment_id"].as_str().unwrap().to_string();
    let looped = "while :; do date >> /workspace/alive; sleep 1; done";
    d.ok(&t, "start_process", json!({"environment_id": env, "command": looped}));
    let worker = d.serve.worker(None);
    let (pid, signal) = match restart {
        Restart::Graceful => (d.serve.supervisor_pid(), libc::SIGHUP),
        Restart::KilledWorker => (worker, libc::SIGKILL),
    };
    // SAFETY: kill(2) on the supervisor this test started, or on its worker.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
    d.serve.worker(Some(worker));
    d.serve.wait_ready(&d.client);
    let status = |d: &Daemon| d.ok(&t, "get_environment_status", json!({"environment_id": env}));
    assert_eq!(status(&d)["state"], "running", "{restart:?}: the environment was not adopted");
    wait_long("the stop at the admitted runtime", Duration::from_secs(90), || status(&d)["state"] == "ended");
    let stopped_after = admitted.elapsed();
    eprintln!("{restart:?}: the environment admitted for 60 s ended {stopped_after:.1?} after its admission");
    assert!(
        (Duration::from_secs(58)..=Duration::from_secs(62)).contains(&stopped_after),
        "{restart:?}: stopped {stopped_after:?} after admission, not at 60 s"
    );
    let ended = status(&d);
    assert_eq!(
        (ended["end_reason"].as_str(), ended["runtime_seconds"].as_u64()),
        (Some("max_runtime"), Some(60)),
        "{ended}"
    );
    assert_eq!(containers_of(&deployment), Vec::<String>::new(), "{restart:?}: its container is left");
    wait_until("settlement of the minute", || d.account()["compute_minutes_remaining"] == 119);
    remove_containers(&deployment);
}

#[test]
fn an_environment_admitted_for_a_minute_ends_at_a_minute_through_a_graceful_restart() {
    an_environment_keeps_its_admitted_runtime_through(Restart::Graceful);
}

#[test]
fn an_environment_admitted_for_a_minute_ends_at_a_minute_through_a_killed_worker() {
    an_environment_keeps_its_admitted_runtime_through(Restart::KilledWorker);
}

/// Issue 22 acceptance d (review N4): `SIGTERM` outside systemd stops the daemon and unmounts its
/// scopes; their environments end first (`daemon_stopped`, billed the time they ran), so no
/// container of the daemon is left running on a dead mount.
#[test]
fn a_stop_leaves_no_container_running_on_a_dead_mount() {
    let setup = Setup::new("");
    let deployment = setup.deployment.clone();
    let mut d = setup.start();
    let t = format!("thread-stop-{}", uid());
    d.provision(&t);
    let env = d.ok(&t, "create_environment", json!({}))["environment_id"].as_str().unwrap().to_string();
    d.ok(
        &t,
        "start_process",
        json!({"environment_id": env, "command": "while :; do date >> /workspace/alive; sleep 1; done"}),
    );
    assert_eq!(running_containers_of(&deployment).len(), 1);
    let exit = d.serve.terminate(Duration::from_secs(60));
    assert!(exit.success(), "{exit}: {}", d.serve.log_text());
    assert_eq!(running_containers_of(&deployment), Vec::<String>::new(), "a container runs on a dead mount");
    assert_eq!(containers_of(&deployment), Vec::<String>::new(), "a stopped container is left");
    let d = setup.start();
    let ended = d.ok(&t, "get_environment_status", json!({"environment_id": env}));
    assert_eq!(
        (ended["state"].as_str(), ended["end_reason"].as_str()),
        (Some("ended"), Some("daemon_stopped")),
        "{ended}"
    );
    assert!(ended["runtime_seconds"].as_u64().is_some_and(|s| (1..60).contains(&s)), "{ended}");
}

/// Review N5 (issue 22): one user's commands, eight at once in two conversations, fill as many
/// workers as the `/tools` class has (4 here). Another user's signed file tools (write, read,
/// list) are answered while every one of those commands is still running: commands run in a
/// class of their own and signatures are checked outside `/tools`. Then every command finishes.
#[test]
fn one_users_commands_leave_other_users_their_file_tools() {
    let setup = Setup::new("[limits]\nworkers_per_route_class = 4\n");
    let (d, deployment) = (setup.start(), setup.deployment.clone());
    let flood: Vec<(String, String, String)> = (0..2)
        .map(|i| {
            let t = format!("thread-flood-{i}-{}", uid());
            let scope = d.provision(&t);
            let (s, env) = d.tool_as("flood", &t, "create_environment", json!({}));
            assert_eq!(s, StatusCode::OK, "{env}");
            (t, scope, env["environment_id"].as_str().unwrap().to_string())
        })
        .collect();
    let answered = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..8)
            .map(|i| {
                let (t, _, env) = &flood[i % 2];
                let (d, answered) = (&d, &answered);
                s.spawn(move || {
                    let command = format!("touch /workspace/started-{i}; sleep 6");
                    let r =
                        d.tool_as("flood", t, "execute_command", json!({"environment_id": env, "command": command}));
                    answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    r
                })
            })
            .collect();
        let started = || {
            let mounts = flood.iter().map(|(_, scope, _)| d.serve.mount_root.join(scope));
            mounts.flat_map(|m| std::fs::read_dir(m).into_iter().flatten()).flatten().count()
        };
        wait_until("four of the flood's commands to run", || started() >= 4);
        let victim = format!("thread-victim-{}", uid());
        d.provision(&victim);
        d.ok(&victim, "write_file", json!({"path": "v.txt", "content": "mine"}));
        assert_eq!(d.ok(&victim, "read_file", json!({"path": "v.txt"}))["content"], "mine");
        d.ok(&victim, "list_dir", json!({"path": "/workspace"}));
        let done = answered.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(done, 0, "the victim's tools waited for {done} of the flood's commands to end");
        for run in runs {
            let (s, out) = run.join().unwrap();
            assert_eq!((s, out["exit_code"].as_i64()), (StatusCode::OK, Some(0)), "{out}");
        }
    });
    remove_containers(&deployment);
}

/// A command that has run and finds no room for its output in its user's share of the `/tools`
/// body budget is answered with how it ended and its output cut (`truncated`), not with a 503
/// that a retry would answer by running it again. The share is held by one of the user's own
/// `read_file` answers that nobody reads (about 21 MiB as JSON: more than the sockets take).
#[test]
fn a_command_without_room_for_its_output_says_how_it_ended() {
    use std::io::Write;
    let setup = Setup::new("\n[limits]\ntools_body_memory_per_user_bytes = 8388608\nhttp_header_timeout_secs = 2\n");
    let (d, deployment) = (setup.start(), setup.deployment.clone());
    let t = format!("thread-o-{}", uid());
    d.provision(&t);
    let env = d.ok(&t, "create_environment", json!({}))["environment_id"].as_str().unwrap().to_string();
    let fill = "head -c 3145728 /dev/zero | tr '\\000' '\\001' > /workspace/ctl.txt; echo small > /workspace/small.txt";
    d.ok(&t, "execute_command", json!({"environment_id": env, "command": fill}));
    let (path, body) = compute_support::signed_body(
        compute_support::daemon::HMAC_SECRET,
        ("user-1", &t),
        "read_file",
        json!({"path": "ctl.txt"}),
        None,
    );
    let body = serde_json::to_vec(&body).unwrap();
    let addr = d.serve.base.trim_start_matches("http://").to_string();
    let mut unread = std::net::TcpStream::connect(&addr).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    unread.write_all(head.as_bytes()).and_then(|()| unread.write_all(&body)).unwrap();
    wait_until("the unread answer to hold the user's share", || {
        let (status, v) = d.tool(&t, "read_file", json!({"path": "small.txt"}));
        status == StatusCode::TOO_MANY_REQUESTS && v["error"]["code"] == "user_busy"
    });
    let (status, out) = d.tool(
        &t,
        "execute_command",
        json!({"environment_id": env, "command": "echo ran > /workspace/ran.txt; echo out; exit 3"}),
    );
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(
        (out["exit_code"].as_i64(), out["truncated"].as_bool(), out["stdout"].as_str()),
        (Some(3), Some(true), Some("")),
        "{out}"
    );
    drop(unread);
    assert_eq!(d.ok(&t, "read_file", json!({"path": "ran.txt"}))["content"], "ran\n", "the command ran once");
    let again = d.ok(&t, "execute_command", json!({"environment_id": env, "command": "echo out"}));
    assert_eq!((again["stdout"].as_str(), again["truncated"].as_bool()), (Some("out\n"), Some(false)), "{again}");
    d.ok(&t, "destroy_environment", json!({"environment_id": env}));
    remove_containers(&deployment);
}
