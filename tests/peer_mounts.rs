//! Read-only peer scopes and the per-user global store through the running daemon (issue 12,
//! acceptance c; seed 003 §3.7, §6.2): a container granted `/threads/{id}` and `/__global__` by
//! `input_objects` reads a sibling thread's file and the global store, cannot write either
//! (`EROFS`: "Read-only file system"), cannot see another user's threads at all (the grant is 404,
//! and nothing of them is in the container), and the escape checks of `docker_isolation.rs` still
//! hold with the extra mounts. The file tools take the same paths with the same rules (under a
//! signed `object_scope` naming them: `peer_views = "granted"`, the default). Needs root,
//! /dev/fuse, a Docker engine and `SCOPEFS_TEST_DOCKER_IMAGE`; without them it fails.

pub mod compute_support;
pub mod isolation_support;
pub mod serve_process;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use compute_support::{compute_toml, docker_image as image, provision, signed_call, uid, Secrets};
use isolation_support::{assert_no_escape, escape_probes, section, Hidden};
use reqwest::blocking::Client;
use reqwest::StatusCode;
use serde_json::{json, Value};
use serve_process::{free_port, write_config as write_base_config, ServeProcess};

const SERVICE_TOKEN: &str = "peer-mounts-service-token-0123456789";
const HMAC_SECRET: &str = "peer-mounts-hmac-secret";
const PRICING: &str = "[pricing]\ndefault_plan = \"pro\"\n\
    [pricing.plans.pro]\ncompute_allowed = true\nmonthly_minutes = 120\nhard_max_runtime_seconds = 7200\n";

struct Daemon {
    serve: ServeProcess,
    client: Client,
    deployment: String,
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        let image = image();
        let port = free_port();
        let deployment = format!("pm-{}", &uid()[20..]);
        let secrets = Secrets { service_token: SERVICE_TOKEN, hmac_secret: HMAC_SECRET, admin_token: None };
        let rest = compute_toml(&deployment, &secrets, &image, PRICING);
        let cfg = write_base_config(dir, port, &rest);
        let serve = ServeProcess::start(dir, &cfg, port, "daemon.log", &[]);
        let mut d =
            Daemon { serve, client: Client::builder().timeout(Duration::from_secs(120)).build().unwrap(), deployment };
        d.serve.wait_ready(&d.client);
        d
    }

    /// Provisions `thread`'s scope, for `user` when given; returns its scope id.
    fn provision(&self, thread: &str, user: Option<&str>) -> String {
        provision(&self.client, &self.serve.base, SERVICE_TOKEN, thread, user)
    }

    /// A signed `/tools/<tool>` call of `user` as `thread`, with `object_scope` when given.
    fn tool(&self, user: &str, thread: &str, tool: &str, params: Value, scope: Option<Value>) -> (StatusCode, Value) {
        signed_call(&self.client, &self.serve.base, HMAC_SECRET, (user, thread), tool, params, scope)
    }

    fn ok(&self, user: &str, thread: &str, tool: &str, params: Value) -> Value {
        self.ok_under(user, thread, tool, params, None)
    }

    /// [`Daemon::ok`] under the signed grant `{"read": [read]}` (peer views need one: `peer_views`).
    fn granted(&self, user: &str, thread: &str, tool: &str, params: Value, read: &str) -> Value {
        self.ok_under(user, thread, tool, params, Some(json!({"read": [read]})))
    }

    fn ok_under(&self, user: &str, thread: &str, tool: &str, params: Value, scope: Option<Value>) -> Value {
        let (s, v) = self.tool(user, thread, tool, params, scope);
        assert_eq!(s, StatusCode::OK, "{tool}: {v}\nlog:\n{}", self.serve.log_text());
        v
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("label=io.scopefs.deployment={}", self.deployment)])
            .output();
        for c in out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default().lines() {
            let _ = Command::new("docker").args(["rm", "-f", c]).output();
        }
    }
}

/// An `input_objects` entry that grants the view mounted at `mount_path`.
fn grant(mount_path: &str) -> Value {
    json!({"file_id": "view", "object_key": "view", "sha256": "0".repeat(64), "size_bytes": 0,
           "mount_path": mount_path, "read_only": true})
}

fn code(v: &Value) -> Option<&str> {
    v["error"]["code"].as_str()
}

/// The container's view of a sibling, the global store and another user's thread (see the
/// module docs); the escape probes of `isolation_support` follow.
const VIEWS: &str = r#"
echo "==SIBLING=="; cat "/threads/$SIB/notes/sib.txt"; echo
echo "==SIBWRITE=="; (echo changed > "/threads/$SIB/notes/sib.txt") 2>&1; (touch "/threads/$SIB/new.txt") 2>&1
echo "==GLOBAL=="; cat /__global__/g.txt; echo
echo "==GLOBALWRITE=="; (echo changed > /__global__/g.txt) 2>&1; (mkdir /__global__/d) 2>&1
echo "==THREADS=="; ls -a /threads
echo "==OTHER=="; ls -a "/threads/$OTHER" 2>&1 || true
echo "==WORKSPACE=="; echo mine > /workspace/own.txt && cat /workspace/own.txt
"#;

/// [`VIEWS`], the escape probes (through every view) and the end marker.
fn script() -> String {
    let peek = ["/workspace/../$OSCOPE", "/threads/../$OSCOPE", "/threads/$SIB/../$OTHER", "/__global__/../$OSCOPE"];
    format!("{VIEWS}{}echo \"==END==\"\n", escape_probes("\"$SECRET\"", &peek))
}

#[test]
fn containers_get_read_only_views_of_the_same_users_threads_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let n = uid();
    let (main, sib, other) = (format!("main-{n}"), format!("sib-{n}"), format!("other-{n}"));
    let main_scope = d.provision(&main, Some("user-1"));
    // The sibling is provisioned without a user: its first signed request binds it to user-1.
    let sib_scope = d.provision(&sib, None);
    let other_scope = d.provision(&other, Some("user-2"));
    let sib_text = format!("sibling notes {n}");
    d.ok("user-1", &sib, "write_file", json!({"path": "notes/sib.txt", "content": sib_text}));
    let secret = format!("secret-{n}.txt");
    d.ok("user-2", &other, "write_file", json!({"path": secret, "content": "user-2 only"}));
    let (s, v) = d.tool("user-2", &sib, "read_file", json!({"path": "notes/sib.txt"}), None);
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, Some("scope_not_found")), "a thread of user-1: {v}");

    // The global store: written only under a write prefix, read by every thread of the user.
    let global = json!({"read": ["/workspace"], "write_prefixes": ["/__global__"]});
    let (s, v) =
        d.tool("user-1", &main, "write_file", json!({"path": "/__global__/g.txt", "content": "glob"}), Some(global));
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["path"], "/__global__/g.txt", "{v}");
    let (s, v) = d.tool("user-1", &main, "write_file", json!({"path": "/__global__/h.txt", "content": "x"}), None);
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, Some("object_scope_denied")), "{v}");
    let g_txt = json!({"path": "/__global__/g.txt"});
    assert_eq!(d.granted("user-1", &sib, "read_file", g_txt.clone(), "/__global__")["content"], "glob");
    let (s, v) = d.tool("user-1", &sib, "read_file", g_txt.clone(), None);
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, Some("object_scope_denied")), "no grant: {v}");
    let (s, v) = d.tool("user-2", &other, "read_file", g_txt, Some(json!({"read": ["/__global__"]})));
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, Some("file_not_found")), "user-2's own store: {v}");

    // File tools on peer paths (under a grant naming them): read-only for /threads, another
    // user's thread is 404.
    let sib_root = format!("/threads/{sib}");
    let read = d.granted("user-1", &main, "read_file", json!({"path": format!("{sib_root}/notes/sib.txt")}), &sib_root);
    assert_eq!(
        (read["content"].as_str(), read["path"].clone()),
        (Some(sib_text.as_str()), json!(format!("/threads/{sib}/notes/sib.txt")))
    );
    let listed = d.granted("user-1", &main, "list_dir", json!({"path": sib_root}), &sib_root);
    assert_eq!(listed["entries"][0]["path"], format!("/threads/{sib}/notes"), "{listed}");
    let grep = d.granted("user-1", &main, "grep_files", json!({"pattern": "sibling", "path": sib_root}), &sib_root);
    assert_eq!(grep["matches"][0]["path"], format!("/threads/{sib}/notes/sib.txt"), "{grep}");
    let glob =
        d.granted("user-1", &main, "glob_files", json!({"pattern": "*.txt", "path": "/__global__"}), "/__global__");
    assert_eq!(glob["matches"], json!(["/__global__/g.txt"]), "{glob}");
    let write_sib = Some(json!({"write_prefixes": [sib_root]}));
    let (s, v) =
        d.tool("user-1", &main, "write_file", json!({"path": format!("{sib_root}/x.txt"), "content": "x"}), write_sib);
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, Some("read_only")), "{v}");
    for (tool, params) in [
        ("read_file", json!({"path": format!("/threads/{other}/{secret}")})),
        ("list_dir", json!({"path": format!("/threads/{other}")})),
        ("download_file", json!({"remote_path": format!("/threads/{other}/{secret}")})),
        ("read_file", json!({"path": format!("/threads/missing-{n}/x")})),
    ] {
        let every_thread = Some(json!({"read": [format!("/threads/{other}"), format!("/threads/missing-{n}")]}));
        let (s, v) = d.tool("user-1", &main, tool, params, every_thread);
        assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, Some("scope_not_found")), "{tool}: {v}");
    }

    // A grant of another user's thread is refused like an unknown thread, and nothing is created.
    let refused = json!({"input_objects": [grant(&format!("/threads/{other}"))]});
    let (s, v) = d.tool("user-1", &main, "create_environment", refused, None);
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, Some("scope_not_found")), "{v}");
    let envs = d.ok("user-1", &main, "list_environments", json!({}));
    assert_eq!(envs["environments"].as_array().map(Vec::len), Some(0), "{envs}");

    let body = json!({"input_objects": [grant(&format!("/threads/{sib}/notes/sib.txt")), grant("/__global__")]});
    let env = d.ok("user-1", &main, "create_environment", body);
    let env_id = env["environment_id"].as_str().unwrap().to_string();
    let script = script()
        .replace("$SIB", &sib)
        .replace("$OTHER", &other)
        .replace("$OSCOPE", &other_scope)
        .replace("$SECRET", &secret);
    let out = d.ok("user-1", &main, "execute_command", json!({"environment_id": env_id, "command": script}));
    let stdout = out["stdout"].as_str().unwrap().to_string();
    assert!(stdout.contains("==END=="), "script did not finish: {out}");

    assert_eq!(section(&stdout, "SIBLING"), vec![sib_text.as_str()], "{stdout}");
    assert_eq!(section(&stdout, "GLOBAL"), vec!["glob"], "{stdout}");
    for name in ["SIBWRITE", "GLOBALWRITE"] {
        let errs = section(&stdout, name);
        assert_eq!(errs.len(), 2, "{name}: both writes must fail: {stdout}");
        assert!(errs.iter().all(|l| l.contains("Read-only file system")), "{name}: not EROFS: {errs:?}");
    }
    assert_eq!(d.ok("user-1", &sib, "read_file", json!({"path": "notes/sib.txt"}))["content"], sib_text.as_str());
    assert_eq!(
        d.granted("user-1", &main, "read_file", json!({"path": "/__global__/g.txt"}), "/__global__")["content"],
        "glob"
    );
    let mut threads = section(&stdout, "THREADS");
    threads.sort_unstable();
    assert_eq!(threads, vec![".", "..", sib.as_str()], "only the granted sibling under /threads");
    assert!(section(&stdout, "OTHER").iter().any(|l| l.contains("No such file")), "{stdout}");
    assert_eq!(section(&stdout, "WORKSPACE"), vec!["mine"], "/workspace stays writable");

    // The escape checks of docker_isolation.rs, with the extra mounts present.
    let mount_root = dir.path().to_string_lossy().into_owned();
    let hidden = Hidden {
        scope_ids: &[&main_scope, &sib_scope, &other_scope],
        not_in_mountinfo: &[&other_scope, &other, &mount_root],
    };
    let mountinfo = assert_no_escape(&stdout, &hidden);
    for target in [format!("/threads/{sib}"), "/__global__".to_string()] {
        let line = mountinfo
            .lines()
            .find(|l| l.split(' ').nth(4) == Some(target.as_str()))
            .unwrap_or_else(|| panic!("no {target} mount in the container's mountinfo:\n{mountinfo}"));
        let opts = line.split(' ').nth(5).unwrap_or_default();
        assert!(opts.split(',').any(|o| o == "ro"), "{target} is not mounted read-only: {line}");
        assert!(line.split(" - ").nth(1).is_some_and(|t| t.starts_with("fuse")), "{target}: {line}");
    }

    // Destroying the environment ends its views; the sibling's scope is untouched and usable.
    d.ok("user-1", &main, "destroy_environment", json!({"environment_id": env_id}));
    d.ok("user-1", &sib, "write_file", json!({"path": "notes/after.txt", "content": "still writable"}));
}

/// The mount options of `target` in a container's `/proc/self/mountinfo` output.
fn mount_options<'a>(mountinfo: &'a str, target: &str) -> Vec<&'a str> {
    let line = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(target))
        .unwrap_or_else(|| panic!("no {target} mount in the container's mountinfo:\n{mountinfo}"));
    line.split(' ').nth(5).unwrap_or_default().split(',').collect()
}

/// Issue 24, item 4 (seed 003 §3.3 "user-global read-write", §3.7 step 3b `read_only = false`):
/// a container whose manifest lists a `/__global__` entry `read_only: false` writes the user's
/// global store, another thread of the user reads what it wrote, and with `/__global__` among its
/// output paths the files it made there are its artifacts (`users/{user}/files/…` keys). An
/// `object_scope` that does not let the request write `/__global__` keeps the same manifest's view
/// read-only (`EROFS`); `/threads/{id}` stays read-only whatever the entry says (400).
#[test]
fn a_manifest_entry_read_only_false_makes_the_global_store_writable_in_the_container() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let n = uid();
    let (main, sib) = (format!("gmain-{n}"), format!("gsib-{n}"));
    d.provision(&main, Some("user-1"));
    d.provision(&sib, Some("user-1"));
    let global = json!({"read": ["/workspace"], "write_prefixes": ["/__global__"]});
    let (s, v) = d.tool(
        "user-1",
        &main,
        "write_file",
        json!({"path": "/__global__/old.txt", "content": "before"}),
        Some(global),
    );
    assert_eq!(s, StatusCode::OK, "{v}");
    let writable = |path: &str| {
        let mut g = grant(path);
        g["read_only"] = json!(false);
        g
    };
    let (s, v) = d.tool(
        "user-1",
        &main,
        "create_environment",
        json!({"input_objects": [writable(&format!("/threads/{sib}"))]}),
        None,
    );
    assert_eq!((s, code(&v)), (StatusCode::BAD_REQUEST, Some("invalid_request")), "writable /threads: {v}");

    let body = json!({"input_objects": [writable("/__global__/old.txt")],
                      "default_output_paths": ["/workspace", "/__global__"]});
    let env = d.ok("user-1", &main, "create_environment", body.clone());
    let env_id = env["environment_id"].as_str().unwrap().to_string();
    let script = "mkdir -p /__global__/lib && echo made > /__global__/lib/made.txt && echo ws > /workspace/w.txt \
                  && echo ==MOUNTINFO== && cat /proc/self/mountinfo";
    let out = d.ok("user-1", &main, "execute_command", json!({"environment_id": env_id, "command": script}));
    assert_eq!(out["exit_code"], 0, "{out}");
    let stdout = out["stdout"].as_str().unwrap();
    let mountinfo = section(stdout, "MOUNTINFO").join("\n");
    assert!(mount_options(&mountinfo, "/__global__").contains(&"rw"), "{mountinfo}");
    let read = d.granted("user-1", &sib, "read_file", json!({"path": "/__global__/lib/made.txt"}), "/__global__");
    assert_eq!(read["content"], "made\n", "another thread of the user reads what the container wrote");
    let done = d.ok("user-1", &main, "destroy_environment", json!({"environment_id": env_id}));
    let arts: Vec<(&str, &str)> = done["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["path"].as_str().unwrap(), a["object_key"].as_str().unwrap()))
        .collect();
    let ws_key = format!("threads/{main}/files/w.txt");
    assert_eq!(
        arts,
        vec![("/__global__/lib/made.txt", "users/user-1/files/lib/made.txt"), ("/workspace/w.txt", ws_key.as_str())],
        "what the job made in both stores, not the global file it found there: {done}"
    );

    // The same manifest under an object_scope that withholds writing /__global__: read-only.
    let reads_only = Some(json!({"read": ["/__global__"], "write_prefixes": ["/workspace"]}));
    let env = d.ok_under("user-1", &main, "create_environment", body, reads_only.clone());
    let env_id = env["environment_id"].as_str().unwrap().to_string();
    let script = "cat /__global__/old.txt; echo; (echo x > /__global__/old.txt) 2>&1; echo ==MOUNTINFO==; cat /proc/self/mountinfo";
    let cmd = json!({"environment_id": env_id, "command": format!("echo ==OUT==; {script}")});
    let out = d.ok_under("user-1", &main, "execute_command", cmd, reads_only.clone());
    let stdout = out["stdout"].as_str().unwrap();
    let lines = section(stdout, "OUT");
    assert_eq!(lines.first().copied(), Some("before"), "{stdout}");
    assert!(lines.iter().any(|l| l.contains("Read-only file system")), "{stdout}");
    let mountinfo = section(stdout, "MOUNTINFO").join("\n");
    assert!(mount_options(&mountinfo, "/__global__").contains(&"ro"), "{mountinfo}");
    d.ok_under("user-1", &main, "destroy_environment", json!({"environment_id": env_id}), reads_only);
}
