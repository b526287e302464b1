//! The contract of the file `/tools/*` routes against the real daemon (issue 12, acceptance a):
//! requests built from seed 003 §4.5's parameters (names and JSON types as the seed writes them:
//! `environment_id`, `path`, `content`, `old_string`, `new_string`, `replace_all`, `pattern`,
//! `glob`, `remote_path`, `content_base64`, `sha256`), signed as §4.3 says, answers checked field by
//! field and type by type; plus unknown fields (400 naming them), unknown environments (404), the
//! signed `object_scope` (403 beyond it), regular-expression grep, edit diffs and returned paths
//! sent back as paths. The last test sends the seed's bodies with a live environment's
//! `environment_id`: it needs Docker and `SCOPEFS_TEST_DOCKER_IMAGE` (scripts/docker.sh) and fails
//! without them; the others need only the daemon.

pub mod tools_support;
pub mod workspace_support;

use std::collections::BTreeSet;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use tools_support::{call, call_scoped, signed_with_scope, start_daemon, SECRET};
use workspace_support::serve_process::{free_port, write_config, ServeProcess};
use workspace_support::{Answer, TOKEN};

fn ok(a: Answer) -> Value {
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    a.json()
}

/// The shape of a JSON value: every object's field names with the shape of their values, arrays
/// as the shape of their first item, scalars as their JSON type name.
fn shape(v: &Value) -> Value {
    match v {
        Value::Null => json!("null"),
        Value::Bool(_) => json!("boolean"),
        Value::Number(n) if n.is_u64() => json!("integer"),
        Value::Number(_) => json!("number"),
        Value::String(_) => json!("string"),
        Value::Array(items) => Value::Array(items.first().map(shape).into_iter().collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), shape(v))).collect::<Map<_, _>>()),
    }
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Every file route with a body of the seed's parameters (§4.5 `ComputeClient` methods, minus the
/// `user_id`/`thread_id` the `auth_context` carries) and the shape its answer must have.
fn seed_calls() -> Vec<(&'static str, Value, Value)> {
    let data = b"col_a,col_b\n1,2\n";
    vec![
        (
            "write_file",
            json!({"path": "/workspace/src/main.py", "content": "def main():\n    return 1\n"}),
            json!({"path": "string", "size_bytes": "integer", "sha256": "string"}),
        ),
        (
            "read_file",
            json!({"path": "/workspace/src/main.py"}),
            json!({"path": "string", "content": "string", "size_bytes": "integer"}),
        ),
        (
            "edit_file",
            json!({"path": "/workspace/src/main.py", "old_string": "return 1", "new_string": "return 2", "replace_all": false}),
            json!({
                "path": "string", "replacements": "integer", "lines_removed": "integer", "lines_added": "integer",
                "size_bytes": "integer", "diff": "string", "diff_truncated": "boolean",
            }),
        ),
        (
            "list_dir",
            json!({"path": "/workspace"}),
            json!({
                "path": "string",
                "entries": [{"name": "string", "path": "string", "type": "string", "size_bytes": "integer", "mtime": "number"}],
                "truncated": "boolean",
            }),
        ),
        (
            "grep_files",
            json!({"pattern": "def \\w+\\(", "path": "/workspace", "glob": "**/*.py"}),
            json!({
                "matches": [{"path": "string", "line_number": "integer", "line": "string"}],
                "files_searched": "integer",
                "truncated": "boolean",
            }),
        ),
        (
            "glob_files",
            json!({"pattern": "**/*.py", "path": "/workspace"}),
            json!({"matches": ["string"], "truncated": "boolean"}),
        ),
        (
            "upload_file",
            json!({"remote_path": "/workspace/data.csv", "content_base64": BASE64.encode(data), "sha256": sha256_hex(data)}),
            json!({"path": "string", "size_bytes": "integer", "sha256": "string"}),
        ),
        (
            "download_file",
            json!({"remote_path": "/workspace/data.csv"}),
            json!({"path": "string", "content_base64": "string", "sha256": "string", "size_bytes": "integer"}),
        ),
    ]
}

#[test]
fn every_file_route_answers_the_seed_fields_with_their_types() {
    let d = start_daemon(&[]);
    d.provision("thr_contract");
    for (name, params, want) in seed_calls() {
        let got = ok(call(&d, name, "thr_contract", params));
        assert_eq!(shape(&got), want, "{name}: {got}");
    }
    // The values, not only their types.
    let read = ok(call(&d, "read_file", "thr_contract", json!({"path": "/workspace/src/main.py"})));
    assert_eq!(read["content"], "def main():\n    return 2\n");
    let down = ok(call(&d, "download_file", "thr_contract", json!({"remote_path": "/workspace/data.csv"})));
    assert_eq!(BASE64.decode(down["content_base64"].as_str().unwrap()).unwrap(), b"col_a,col_b\n1,2\n");
    assert_eq!(down["sha256"], sha256_hex(b"col_a,col_b\n1,2\n"));
    let glob = ok(call(&d, "glob_files", "thr_contract", json!({"pattern": "**/*.py"})));
    assert_eq!(glob["matches"], json!(["/workspace/src/main.py"]), "path defaults to /workspace");
}

#[test]
fn unknown_fields_are_400_naming_them_and_unknown_environments_404() {
    let d = start_daemon(&[]);
    d.provision("thr_fields");
    for (name, params, _) in seed_calls() {
        let mut extra = params.clone();
        extra["surprise_field"] = json!(1);
        let a = call(&d, name, "thr_fields", extra);
        assert_eq!((a.status, a.code().as_str()), (StatusCode::BAD_REQUEST, "invalid_request"), "{name}: {}", a.text());
        assert!(a.text().contains("surprise_field"), "{name}: the answer names the field: {}", a.text());

        let mut env = params.clone();
        env["environment_id"] = json!("env_does_not_exist");
        let a = call(&d, name, "thr_fields", env);
        assert_eq!(
            (a.status, a.code().as_str()),
            (StatusCode::NOT_FOUND, "environment_not_found"),
            "{name}: {}",
            a.text()
        );
    }
    assert_eq!(
        call(&d, "read_file", "thr_fields", json!({"path": "/workspace/src/main.py"})).status,
        StatusCode::NOT_FOUND,
        "no refused write went through"
    );
}

#[test]
fn object_scope_bounds_reads_and_writes_with_403() {
    let d = start_daemon(&[]);
    d.provision("thr_scope");
    for (path, content) in [("in/data.csv", "a,b\nneedle\n"), ("secret/key.txt", "needle\n"), ("top.txt", "t\n")] {
        ok(call(&d, "write_file", "thr_scope", json!({"path": path, "content": content})));
    }
    let grant = json!({"read": ["/workspace/in/data.csv"], "write_prefixes": ["/workspace/out/"]});
    let scoped = |name: &str, params: Value| call_scoped(&d, name, "thr_scope", params, &grant);
    let denied = |a: Answer, what: &str| {
        assert_eq!(
            (a.status, a.code().as_str()),
            (StatusCode::FORBIDDEN, "object_scope_denied"),
            "{what}: {}",
            a.text()
        );
    };

    // Reads.
    assert_eq!(ok(scoped("read_file", json!({"path": "/workspace/in/data.csv"})))["content"], "a,b\nneedle\n");
    denied(scoped("read_file", json!({"path": "/workspace/secret/key.txt"})), "read outside");
    denied(scoped("download_file", json!({"remote_path": "top.txt"})), "download outside");
    denied(scoped("list_dir", json!({"path": "/workspace/secret"})), "list outside");
    let root = ok(scoped("list_dir", json!({"path": "/workspace"})));
    let names: BTreeSet<&str> =
        root["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, BTreeSet::from(["in"]), "a listing shows only the way to what is granted");
    let grep = ok(scoped("grep_files", json!({"pattern": "needle", "path": "/workspace"})));
    let hits: Vec<&str> = grep["matches"].as_array().unwrap().iter().map(|m| m["path"].as_str().unwrap()).collect();
    assert_eq!(hits, vec!["/workspace/in/data.csv"]);
    let glob = ok(scoped("glob_files", json!({"pattern": "**/*.*"})));
    assert_eq!(glob["matches"], json!(["/workspace/in/data.csv"]));

    // Writes.
    denied(scoped("write_file", json!({"path": "/workspace/top.txt", "content": "x"})), "write outside");
    denied(
        scoped("write_file", json!({"path": "/workspace/output.txt", "content": "x"})),
        "prefixes are by components",
    );
    denied(
        scoped("edit_file", json!({"path": "/workspace/in/data.csv", "old_string": "a,b", "new_string": "c"})),
        "edit of a read-only grant",
    );
    let data = b"r";
    denied(
        scoped(
            "upload_file",
            json!({"remote_path": "/workspace/top.txt", "content_base64": BASE64.encode(data), "sha256": sha256_hex(data)}),
        ),
        "upload outside",
    );
    ok(scoped("write_file", json!({"path": "/workspace/out/result.txt", "content": "r1"})));
    ok(scoped("edit_file", json!({"path": "/workspace/out/result.txt", "old_string": "r1", "new_string": "r2"})));
    ok(scoped(
        "upload_file",
        json!({"remote_path": "out/r.bin", "content_base64": BASE64.encode(data), "sha256": sha256_hex(data)}),
    ));
    assert_eq!(ok(scoped("read_file", json!({"path": "/workspace/out/result.txt"})))["content"], "r2");

    // Nothing refused changed anything; without object_scope the thread's own rules apply.
    let plain = ok(call(&d, "read_file", "thr_scope", json!({"path": "top.txt"})));
    assert_eq!(plain["content"], "t\n");
    assert_eq!(ok(call(&d, "read_file", "thr_scope", json!({"path": "in/data.csv"})))["content"], "a,b\nneedle\n");
    // A malformed object_scope is refused, not ignored.
    let bad = call_scoped(&d, "read_file", "thr_scope", json!({"path": "top.txt"}), &json!({"read": "top.txt"}));
    assert_eq!((bad.status, bad.code().as_str()), (StatusCode::BAD_REQUEST, "invalid_auth_context"));

    // Issue 24, item 2: the same grant as object keys of seed 003's layout (the thread's files are
    // `threads/{thread_id}/files/{path}`); a key scopefs does not hold grants nothing.
    let keys = json!({"read": ["threads/thr_scope/files/in/data.csv", "objects/in/data.csv"],
                      "write_prefixes": ["threads/thr_scope/files/out/"]});
    let keyed = |name: &str, params: Value| call_scoped(&d, name, "thr_scope", params, &keys);
    assert_eq!(ok(keyed("read_file", json!({"path": "in/data.csv"})))["content"], "a,b\nneedle\n");
    denied(keyed("read_file", json!({"path": "top.txt"})), "read outside the keys");
    denied(keyed("read_file", json!({"path": "/workspace/objects/in/data.csv"})), "an object key is no path");
    ok(keyed("write_file", json!({"path": "out/keyed.txt", "content": "k"})));
    denied(keyed("write_file", json!({"path": "in/keyed.txt", "content": "k"})), "write outside the keys");
}

#[test]
fn grep_takes_bounded_regular_expressions() {
    let d = start_daemon(&[]);
    d.provision("thr_regex");
    ok(call(&d, "write_file", "thr_regex", json!({"path": "a.py", "content": "def alpha(x):\n  fn()\ndef (\n"})));
    ok(call(&d, "write_file", "thr_regex", json!({"path": "b.txt", "content": "v1.2.3\nv12\n"})));
    let lines = |pattern: &str| -> Vec<(String, u64)> {
        let v = ok(call(&d, "grep_files", "thr_regex", json!({"pattern": pattern, "path": "/workspace"})));
        let mut out: Vec<(String, u64)> = v["matches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["line"].as_str().unwrap().to_string(), m["line_number"].as_u64().unwrap()))
            .collect();
        out.sort();
        out
    };
    assert_eq!(lines(r"^def \w+\("), vec![("def alpha(x):".to_string(), 1)]);
    assert_eq!(lines(r"^v\d+\.\d+\.\d+$"), vec![("v1.2.3".to_string(), 1)]);
    assert_eq!(lines(r"v1\."), vec![("v1.2.3".to_string(), 1)], "a '.' escaped is literal");
    let invalid = call(&d, "grep_files", "thr_regex", json!({"pattern": "def (", "path": "/workspace"}));
    assert_eq!((invalid.status, invalid.code().as_str()), (StatusCode::BAD_REQUEST, "invalid_pattern"));
    assert!(invalid.text().contains("unclosed group"), "the answer names the problem: {}", invalid.text());
    // Compiles beyond [limits] grep_max_regex_bytes (default 1 MiB): 413 before anything is read.
    let huge = call(&d, "grep_files", "thr_regex", json!({"pattern": r"\w{1000}\w{1000}\w{1000}"}));
    assert_eq!((huge.status, huge.code().as_str()), (StatusCode::PAYLOAD_TOO_LARGE, "too_large"), "{}", huge.text());
}

#[test]
fn edit_answers_a_unified_diff() {
    let d = start_daemon(&[]);
    d.provision("thr_diff");
    let before: String = (1..=9).map(|i| format!("line {i}\n")).collect();
    ok(call(&d, "write_file", "thr_diff", json!({"path": "n.txt", "content": before})));
    let e = ok(call(
        &d,
        "edit_file",
        "thr_diff",
        json!({"path": "/workspace/n.txt", "old_string": "line 5\n", "new_string": "five\nand a half\n"}),
    ));
    assert_eq!(
        e["diff"],
        "--- /workspace/n.txt\n+++ /workspace/n.txt\n@@ -2,7 +2,8 @@\n line 2\n line 3\n line 4\n-line 5\n+five\n\
         +and a half\n line 6\n line 7\n line 8\n"
    );
    assert_eq!(e["diff_truncated"], false);
    // A diff over [limits] edit_max_diff_bytes is cut there and says so.
    let big = "x\n".repeat(100_000);
    ok(call(&d, "write_file", "thr_diff", json!({"path": "big.txt", "content": big})));
    let e = ok(call(
        &d,
        "edit_file",
        "thr_diff",
        json!({"path": "big.txt", "old_string": "x", "new_string": "y", "replace_all": true}),
    ));
    assert_eq!((e["replacements"].as_u64(), e["diff_truncated"].as_bool()), (Some(100_000), Some(true)));
    assert!(e["diff"].as_str().unwrap().len() <= 64 * 1024);
    assert_eq!(ok(call(&d, "read_file", "thr_diff", json!({"path": "big.txt"})))["content"], "y\n".repeat(100_000));
}

#[test]
fn paths_the_tools_return_are_taken_back_as_paths() {
    let d = start_daemon(&[]);
    d.provision("thr_round");
    let w = ok(call(&d, "write_file", "thr_round", json!({"path": "docs/notes.md", "content": "hello\n"})));
    let written = w["path"].as_str().unwrap().to_string();
    assert_eq!(written, "/workspace/docs/notes.md");
    assert_eq!(ok(call(&d, "read_file", "thr_round", json!({"path": written})))["content"], "hello\n");
    let list = ok(call(&d, "list_dir", "thr_round", json!({"path": "/workspace"})));
    let dir = list["entries"][0]["path"].as_str().unwrap().to_string();
    let inner = ok(call(&d, "list_dir", "thr_round", json!({"path": dir})));
    let file = inner["entries"][0]["path"].as_str().unwrap().to_string();
    assert_eq!(file, "/workspace/docs/notes.md");
    let glob = ok(call(&d, "glob_files", "thr_round", json!({"pattern": "**/*.md"})));
    let found = glob["matches"][0].as_str().unwrap().to_string();
    let down = ok(call(&d, "download_file", "thr_round", json!({"remote_path": found})));
    assert_eq!(down["path"], "/workspace/docs/notes.md");
    let grep = ok(call(&d, "grep_files", "thr_round", json!({"pattern": "hel+o"})));
    let hit = grep["matches"][0]["path"].as_str().unwrap().to_string();
    ok(call(&d, "edit_file", "thr_round", json!({"path": hit, "old_string": "hello", "new_string": "bye"})));
    // The same file through the WebUI API, by the virtual_path that API answers with.
    let listing = d.send(d.client.get(d.url("/api/workspace")).query(&[("threadId", "thr_round"), ("path", "/docs")]));
    assert_eq!(listing.status, StatusCode::OK, "{}", listing.text());
    let vp = listing.json()["entries"][0]["virtual_path"].as_str().unwrap().to_string();
    assert_eq!(vp, "/docs/notes.md");
    assert_eq!(d.read("thr_round", &vp).body, b"bye\n");
}

/// A daemon with the Docker executor and a plan that allows compute, under a deployment id of its
/// own: every daemon reconciles the containers labelled with its deployment at startup, so under the
/// default id another test's daemon (in this binary or another) would remove this one's container.
fn daemon_with_compute(dir: &std::path::Path) -> (ServeProcess, reqwest::blocking::Client) {
    let image = std::env::var("SCOPEFS_TEST_DOCKER_IMAGE").unwrap_or_default();
    assert!(
        !image.is_empty(),
        "SCOPEFS_TEST_DOCKER_IMAGE is not set: run `eval \"$(bash scripts/docker.sh)\"` (or scripts/test.sh)"
    );
    let port = free_port();
    let deployment = format!("files-{}", uuid::Uuid::now_v7().simple());
    let rest = format!(
        "deployment_id = {deployment:?}\nservice_token = {TOKEN:?}\nhmac_secret = {SECRET:?}\n\n\
         [store]\nkind = \"local\"\n\n[executor]\nimage = {image:?}\nmax_runtime_secs = 600\n\
         command_timeout_secs = 30\n\n[pricing]\ndefault_plan = \"pro\"\n[pricing.plans.pro]\n\
         compute_allowed = true\nmonthly_minutes = 120\nhard_max_runtime_seconds = 7200\n"
    );
    let cfg = write_config(dir, port, &rest);
    let mut serve = ServeProcess::start(dir, &cfg, port, "daemon.log", &[]);
    let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
    serve.wait_ready(&client);
    (serve, client)
}

#[test]
fn seed_bodies_with_a_live_environment_id_and_an_ended_one() {
    let dir = tempfile::tempdir().unwrap();
    let (mut serve, client) = daemon_with_compute(dir.path());
    let base = serve.base.clone();
    let provision = client
        .post(format!("{base}/internal/workspace-scopes/provision"))
        .bearer_auth(TOKEN)
        .json(&json!({"operation_id": "op-thr_env", "primary_thread_id": "thr_env"}))
        .send()
        .unwrap();
    assert!(provision.status().is_success(), "{:?}", provision.text());
    let tool = |name: &str, params: Value| -> (StatusCode, Value) {
        let path = format!("/tools/{name}");
        let body = signed_with_scope(&path, "thr_env", &params, None);
        let resp = client.post(format!("{base}{path}")).header("content-type", "application/json").body(body);
        let resp = resp.send().unwrap();
        let status = resp.status();
        (status, resp.json().unwrap_or(Value::Null))
    };
    let (status, env) = tool("create_environment", json!({"max_runtime_seconds": 60}));
    assert_eq!(status, StatusCode::OK, "{env}");
    let env_id = env["environment_id"].as_str().expect("environment_id").to_string();
    for (name, mut params, want) in seed_calls() {
        params["environment_id"] = json!(env_id);
        let (status, got) = tool(name, params);
        assert_eq!(status, StatusCode::OK, "{name}: {got}");
        assert_eq!(shape(&got), want, "{name}: {got}");
    }
    // Commands reach all of `/workspace`: under an object_scope without a write prefix covering it,
    // a writable environment refuses them (403); with one, they run.
    let command = |scope: Value| {
        let params = json!({"environment_id": env_id, "command": "echo hi"});
        let body = signed_with_scope("/tools/execute_command", "thr_env", &params, Some(&scope));
        let resp = client.post(format!("{base}/tools/execute_command")).header("content-type", "application/json");
        let resp = resp.body(body).send().unwrap();
        let status = resp.status();
        (status, resp.json::<Value>().unwrap_or(Value::Null))
    };
    let (status, denied) = command(json!({"read": ["/workspace"], "write_prefixes": []}));
    assert_eq!((status, denied["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("object_scope_denied")));
    let (status, ran) = command(json!({"read": [], "write_prefixes": ["/workspace"]}));
    assert_eq!((status, ran["exit_code"].as_i64()), (StatusCode::OK, Some(0)), "{ran}");
    // Issue 24, item 2: seed 003 §4.4's golden object_scope (object keys: an input object and the
    // job's artifacts prefix) runs the command; at 2351eb5 it was 403.
    let (status, golden) =
        command(json!({"read": ["objects/in/data.csv"], "write_prefixes": ["jobs/job_1/artifacts/"]}));
    let answer = (status, golden["exit_code"].as_i64(), golden["stdout"].as_str());
    assert_eq!(answer, (StatusCode::OK, Some(0), Some("hi\n")), "{golden}");
    let (status, ended) = tool("destroy_environment", json!({"environment_id": env_id}));
    assert_eq!(status, StatusCode::OK, "{ended}");
    let (status, gone) = tool("read_file", json!({"environment_id": env_id, "path": "/workspace/src/main.py"}));
    assert_eq!((status, gone["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("environment_not_found")));
    let (status, _) = tool("read_file", json!({"path": "/workspace/src/main.py"}));
    assert_eq!(status, StatusCode::OK, "the files outlive the environment");
    serve.stop(Duration::from_secs(30));
}
