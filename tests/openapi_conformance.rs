//! Issue 25 acceptance a: every route of a running daemon (Docker executor, admin token, pricing)
//! is called, with a success and its main errors, and every answer is checked against the daemon's
//! own `/openapi.json`: its status must be one the document lists for the route, and its JSON body
//! must validate against the schema the document gives for that route and status (`jsonschema`,
//! JSON Schema 2020-12, `$ref`s resolved in the document's `components`). Binary answers must have
//! the content type the document names. Every (method, path) of the document must be called.

pub mod compute_support;
pub mod serve_process;

mod conformance_support;

use compute_support::daemon::{remove_containers, wait_until, Setup, ADMIN_TOKEN};
use compute_support::uid;
use conformance_support::{Ask, Checker};
use serde_json::{json, Value};

/// Removes the deployment's containers when the test ends, passed or failed.
struct Containers(String);

impl Drop for Containers {
    fn drop(&mut self) {
        remove_containers(&self.0);
    }
}

/// A well-formed scope id no scope has.
const UNKNOWN_SCOPE: &str = "0190a1b2-0000-7000-8000-000000000000";

fn s(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_else(|| panic!("no string {key} in {v}")).to_string()
}

#[test]
fn every_answer_of_every_route_conforms_to_the_openapi_document() {
    let setup = Setup::new("");
    let _containers = Containers(setup.deployment.clone());
    let daemon = setup.start();
    let mut c = Checker::new(&daemon.serve.base);

    // Public routes, and the document itself.
    c.call("GET", "/health", "/health", Ask::new()).expect(200);
    c.call("GET", "/ready", "/ready", Ask::new()).expect(200);
    c.call("GET", "/openapi.json", "/openapi.json", Ask::new()).expect(200);
    c.call("GET", "/metrics", "/metrics", Ask::service()).expect(200);
    c.call("GET", "/metrics", "/metrics", Ask::new()).expect_code(401, "unauthorized");

    let (scope, thread) = internal_routes(&mut c);
    fork_routes(&mut c, &scope);
    workspace_routes(&mut c, &thread);
    tool_file_routes(&mut c, &thread);
    let usage_env = compute_routes(&mut c, &thread);
    admin_routes(&mut c, &usage_env);
    admin_ui_routes(&mut c);

    let (routes, answers) = c.finish();
    println!("summary: openapi conformance: {routes} routes, {answers} answers validated");
}

/// `/internal/*`: scopes, owners, runs, leases, the cutover report. Returns an active scope and its thread.
fn internal_routes(c: &mut Checker) -> (String, String) {
    let thread = uid();
    let provision = "/internal/workspace-scopes/provision";
    let body = json!({"operation_id": format!("op-{thread}"), "primary_thread_id": thread, "user_id": "user-1"});
    let scope = c.call("POST", provision, provision, Ask::service().json(body.clone())).expect(201);
    c.call("POST", provision, provision, Ask::service().json(body)).expect(200);
    let bad = json!({"operation_id": "op-bad", "primary_thread_id": "not a thread"});
    c.call("POST", provision, provision, Ask::service().json(bad)).expect_code(400, "invalid_thread_id");
    c.call("POST", provision, provision, Ask::service().raw("application/json", b"{".to_vec()))
        .expect_code(400, "invalid_json");
    c.call("POST", provision, provision, Ask::new().json(json!({}))).expect_code(401, "unauthorized");
    let scope_id = s(&scope, "scope_id");

    let report = "/internal/workspace-cutover/report";
    c.call("POST", report, report, Ask::service()).expect_code(409, "migration-required");

    let by_thread = "/internal/workspace-scopes/by-thread/{thread_id}";
    c.call("GET", by_thread, &format!("/internal/workspace-scopes/by-thread/{thread}"), Ask::service()).expect(200);
    c.call("GET", by_thread, &format!("/internal/workspace-scopes/by-thread/{}", uid()), Ask::service())
        .expect_code(404, "scope_not_found");

    let patch = "/internal/workspace-scopes/{scope_id}";
    let at = format!("/internal/workspace-scopes/{scope_id}");
    let stale = json!({"expected_revision": 99, "state": "active"});
    c.call("PATCH", patch, &at, Ask::service().json(stale)).expect_code(409, "revision_conflict");
    let rev = scope["revision"].as_u64().unwrap();
    c.call("PATCH", patch, &at, Ask::service().json(json!({"expected_revision": rev, "state": "active"}))).expect(200);
    c.call(
        "PATCH",
        patch,
        "/internal/workspace-scopes/bad!id",
        Ask::service().json(json!({"expected_revision": 1, "state": "active"})),
    )
    .expect_code(400, "invalid_scope_id");

    let mount = "/internal/workspace-scopes/{scope_id}/mount";
    c.call("GET", mount, &format!("{at}/mount"), Ask::service()).expect(200);
    c.call("GET", mount, &format!("/internal/workspace-scopes/{UNKNOWN_SCOPE}/mount"), Ask::service())
        .expect_code(404, "scope_not_found");
    let gc = "/internal/workspace-scopes/{scope_id}/gc";
    c.call("POST", gc, &format!("{at}/gc"), Ask::service()).expect(200);
    c.call("POST", gc, &format!("/internal/workspace-scopes/{UNKNOWN_SCOPE}/gc"), Ask::service())
        .expect_code(404, "scope_not_found");

    let owners = "/internal/workspace-scopes/{scope_id}/owners";
    let ob = json!({"owner_type": "async_thread", "resource_id": format!("res-{}", uid())});
    let owner = c.call("POST", owners, &format!("{at}/owners"), Ask::service().json(ob.clone())).expect(201);
    c.call("POST", owners, &format!("{at}/owners"), Ask::service().json(ob.clone())).expect(200);
    let owner_id = s(&owner, "owner_id");
    let one = "/internal/workspace-scopes/{scope_id}/owners/{owner_id}";
    let patch_owner = json!({"state": "active"});
    c.call("PATCH", one, &format!("{at}/owners/{owner_id}"), Ask::service().json(patch_owner)).expect(200);
    c.call("PATCH", one, &format!("{at}/owners/nobody"), Ask::service().json(json!({"state": "active"})))
        .expect_code(404, "owner_not_found");
    let by_res = "/internal/workspace-scopes/{scope_id}/owners/by-resource/{resource_id}";
    let res = s(&ob, "resource_id");
    c.call("GET", by_res, &format!("{at}/owners/by-resource/{res}?owner_type=async_thread"), Ask::service())
        .expect(200);
    c.call("GET", by_res, &format!("{at}/owners/by-resource/none"), Ask::service()).expect_code(404, "owner_not_found");
    c.call("GET", by_res, &format!("{at}/owners/by-resource/{res}?owner_type=nonsense"), Ask::service())
        .expect_code(400, "invalid_query");

    let reserve = "/internal/workspace-scopes/{scope_id}/runs/reserve";
    let rb = json!({"run_request_id": "rr-1", "turn_id": "t-1", "request_hash": "h"});
    c.call("POST", reserve, &format!("{at}/runs/reserve"), Ask::service().json(rb.clone())).expect(201);
    c.call("POST", reserve, &format!("{at}/runs/reserve"), Ask::service().json(rb)).expect(200);
    let other = json!({"run_request_id": "rr-1", "turn_id": "t-1", "request_hash": "other"});
    c.call("POST", reserve, &format!("{at}/runs/reserve"), Ask::service().json(other))
        .expect_code(409, "idempotency_key_conflict");
    let run = "/internal/workspace-scopes/{scope_id}/runs/{run_request_id}";
    let started = json!({"run_id": "run-1", "state": "started"});
    c.call("PATCH", run, &format!("{at}/runs/rr-1"), Ask::service().json(started)).expect(200);
    c.call("PATCH", run, &format!("{at}/runs/nope"), Ask::service().json(json!({"state": "started"})))
        .expect_code(404, "run_request_not_found");

    let lease = "/internal/leases/{lock_name}";
    let name = format!("/internal/leases/lock-{}", uid());
    let mine = json!({"operation_id": "op-a", "ttl_seconds": 60});
    c.call("POST", lease, &name, Ask::service().json(mine.clone())).expect(200);
    let theirs = json!({"operation_id": "op-b", "ttl_seconds": 60});
    c.call("POST", lease, &name, Ask::service().json(theirs.clone())).expect_code(409, "lease_held");
    c.call("PATCH", lease, &name, Ask::service().json(mine)).expect(200);
    c.call("PATCH", lease, &name, Ask::service().json(theirs)).expect_code(409, "lease_not_held");
    c.call("DELETE", lease, &format!("{name}?operation_id=op-b"), Ask::service()).expect_code(409, "lease_not_held");
    c.call("DELETE", lease, &format!("{name}?operation_id=op-a"), Ask::service()).expect(200);
    c.call("DELETE", lease, &name, Ask::service()).expect_code(400, "invalid_query");
    (scope_id, thread)
}

/// Forks and snapshots of `scope`.
fn fork_routes(c: &mut Checker, scope: &str) {
    let at = format!("/internal/workspace-scopes/{scope}");
    let snaps = "/internal/workspace-scopes/{scope_id}/snapshots";
    c.call("POST", snaps, &format!("{at}/snapshots"), Ask::service().json(json!({"snapshot_id": "snap-1"})))
        .expect(201);
    c.call("POST", snaps, &format!("{at}/snapshots"), Ask::service().json(json!({"snapshot_id": "out.x"})))
        .expect_code(400, "invalid_request");
    c.call("GET", snaps, &format!("{at}/snapshots"), Ask::service()).expect(200);
    c.call("GET", snaps, &format!("/internal/workspace-scopes/{UNKNOWN_SCOPE}/snapshots"), Ask::service())
        .expect_code(404, "scope_not_found");
    let restore = "/internal/workspace-scopes/{scope_id}/snapshots/{snapshot_id}/restore";
    c.call("POST", restore, &format!("{at}/snapshots/snap-1/restore"), Ask::service()).expect(200);
    c.call("POST", restore, &format!("{at}/snapshots/none/restore"), Ask::service())
        .expect_code(404, "scope_not_found");
    let fork = "/internal/workspace-scopes/{scope_id}/fork";
    let fb = json!({"operation_id": format!("op-fork-{}", uid()), "primary_thread_id": uid()});
    let forked = c.call("POST", fork, &format!("{at}/fork"), Ask::service().json(fb.clone())).expect(201);
    assert_eq!(forked["forked_from"], scope, "{forked}");
    c.call("POST", fork, &format!("{at}/fork"), Ask::service().json(fb)).expect(200);
    let fb = json!({"operation_id": "op-fork-x", "primary_thread_id": uid()});
    let unknown = format!("/internal/workspace-scopes/{UNKNOWN_SCOPE}/fork");
    c.call("POST", fork, &unknown, Ask::service().json(fb.clone())).expect_code(404, "scope_not_found");
    c.call("POST", fork, "/internal/workspace-scopes/scp_1/fork", Ask::service().json(fb))
        .expect_code(400, "invalid_scope_id");
}

/// `/api/workspace*` of `thread`'s scope.
fn workspace_routes(c: &mut Checker, thread: &str) {
    let q = |path: &str| format!("{path}?threadId={thread}");
    let file = "/api/workspace/file";
    let write = Ask::service().raw("application/octet-stream", b"hello workspace\n".to_vec());
    c.call("PUT", file, &format!("{}&path=notes/a.txt", q(file)), write).expect(200);
    let again = Ask::service().raw("application/octet-stream", b"x".to_vec());
    c.call("PUT", file, &format!("{}&path=notes/a.txt&snapshotId=snap-1", q(file)), again)
        .expect_code(400, "snapshot_read_only");
    c.call("GET", file, &format!("{}&path=notes/a.txt", q(file)), Ask::service()).expect(200);
    c.call("GET", file, &format!("{}&path=notes/a.txt", q(file)), Ask::service().header("Range", "bytes=0-4"))
        .expect(206);
    c.call("GET", file, &format!("{}&path=notes/a.txt", q(file)), Ask::service().header("Range", "bytes=900-"))
        .expect_code(416, "range_not_satisfiable");
    c.call("GET", file, &format!("{}&path=missing.txt", q(file)), Ask::service()).expect_code(404, "not_found");
    c.call("GET", file, &format!("{}&path=../etc/passwd", q(file)), Ask::service()).expect_code(400, "invalid_path");
    c.call("GET", file, "/api/workspace/file?threadId=bad!&path=a", Ask::service())
        .expect_code(400, "invalid_thread_id");

    let list = "/api/workspace";
    c.call("GET", list, &q(list), Ask::service()).expect(200);
    c.call("GET", list, &format!("{}&recursive=1&snapshotId=snap-1", q(list)), Ask::service()).expect(200);
    c.call("GET", list, &format!("/api/workspace?threadId={}", uid()), Ask::service()).expect_code(404, "not_found");

    let upload = "/api/workspace/upload";
    let boundary = "conformance-boundary";
    let form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"up.txt\"\r\n\
         Content-Type: text/plain\r\n\r\nuploaded\r\n--{boundary}--\r\n"
    );
    let media = format!("multipart/form-data; boundary={boundary}");
    c.call("POST", upload, &format!("{}&dir=docs", q(upload)), Ask::service().raw(&media, form.clone().into_bytes()))
        .expect(201);
    c.call("POST", upload, &format!("{}&dir=docs", q(upload)), Ask::service().raw(&media, form.into_bytes()))
        .expect_code(409, "file_exists");
    let empty = format!("--{boundary}--\r\n");
    c.call("POST", upload, &q(upload), Ask::service().raw(&media, empty.into_bytes())).expect_code(400, "no_files");

    let download = "/api/workspace/download";
    c.call("GET", download, &q(download), Ask::service()).expect(200);
    let usage = "/api/workspace/usage";
    c.call("GET", usage, &q(usage), Ask::service()).expect(200);
    c.call("GET", usage, usage, Ask::service()).expect_code(400, "invalid_thread_id");

    let import = "/api/workspace/import";
    let ib = json!({"source_path": "old.txt", "idempotency_key": "k-1"});
    c.call("POST", import, &q(import), Ask::service().json(ib)).expect_code(404, "legacy_unavailable");
    c.call("POST", import, &q(import), Ask::service().json(json!({"bogus": 1}))).expect_code(400, "invalid_json");
    let imports = "/api/workspace/imports";
    c.call("GET", imports, &q(imports), Ask::service()).expect(200);
    c.call("GET", imports, &format!("{}&limit=0", q(imports)), Ask::service()).expect_code(400, "invalid_limit");

    c.call("DELETE", file, &format!("{}&path=notes", q(file)), Ask::service()).expect_code(409, "directory_not_empty");
    c.call("DELETE", file, &format!("{}&path=notes/a.txt", q(file)), Ask::service()).expect(204);
}

/// The file tools, signed as `thread` of `user-1`.
fn tool_file_routes(c: &mut Checker, thread: &str) {
    let ok = |c: &mut Checker, tool: &str, params: Value| c.tool(thread, tool, params).expect(200);
    ok(c, "write_file", json!({"path": "/workspace/t/a.txt", "content": "one\ntwo\n"}));
    ok(c, "read_file", json!({"path": "/workspace/t/a.txt"}));
    c.tool(thread, "read_file", json!({"path": "/workspace/t/none.txt"})).expect_code(404, "file_not_found");
    c.tool(thread, "read_file", json!({"path": "/etc/passwd"})).expect_code(400, "invalid_path");
    c.tool(thread, "read_file", json!({"nonsense": true})).expect_code(400, "invalid_request");
    ok(c, "edit_file", json!({"path": "/workspace/t/a.txt", "old_string": "two", "new_string": "three"}));
    c.tool(thread, "edit_file", json!({"path": "/workspace/t/a.txt", "old_string": "zzz", "new_string": "y"}))
        .expect_code(409, "old_string_not_found");
    ok(c, "list_dir", json!({"path": "/workspace/t"}));
    c.tool(thread, "list_dir", json!({"path": "/workspace/t/a.txt"})).expect_code(409, "not_a_directory");
    c.tool(thread, "write_file", json!({"path": "/workspace/t/a.txt/x", "content": "y"}))
        .expect_code(409, "not_a_directory");
    c.tool(thread, "glob_files", json!({"pattern": "*", "path": "/workspace/none"})).expect_code(404, "file_not_found");
    ok(c, "grep_files", json!({"pattern": "one", "path": "/workspace"}));
    c.tool(thread, "grep_files", json!({"pattern": "(", "path": "/workspace"})).expect_code(400, "invalid_pattern");
    ok(c, "glob_files", json!({"pattern": "**/*.txt"}));
    let content = "aGVsbG8=";
    let sha = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
    ok(c, "upload_file", json!({"remote_path": "/workspace/t/b.bin", "content_base64": content, "sha256": sha}));
    c.tool(
        thread,
        "upload_file",
        json!({"remote_path": "/workspace/t/c.bin", "content_base64": content, "sha256": "00"}),
    )
    .expect_code(400, "sha256_mismatch");
    ok(c, "download_file", json!({"remote_path": "/workspace/t/b.bin"}));
    c.tool(thread, "download_file", json!({"remote_path": "/workspace/t/none"})).expect_code(404, "file_not_found");
    c.tool(uid().as_str(), "list_dir", json!({})).expect_code(404, "scope_not_found");
    c.unsigned("write_file", json!({"path": "x", "content": "y", "auth_context": {"user_id": "u"}}))
        .expect_code(401, "invalid_auth_context");
    c.unsigned("list_environments", json!({})).expect_code(401, "invalid_auth_context");
}

/// Environments and processes of `thread`'s scope; returns the ended environment's id.
fn compute_routes(c: &mut Checker, thread: &str) -> String {
    let env = c.tool(thread, "create_environment", json!({"max_runtime_seconds": 300})).expect(200);
    let env_id = s(&env, "environment_id");
    c.tool(thread, "create_environment", json!({"image_ref": "not-the-image"})).expect_code(403, "image_not_allowed");
    c.tool(thread, "list_environments", json!({})).expect(200);
    c.tool(thread, "get_environment_status", json!({"environment_id": env_id})).expect(200);
    c.tool(thread, "get_environment_status", json!({"environment_id": "env_none"}))
        .expect_code(404, "environment_not_found");
    let cmd =
        json!({"environment_id": env_id, "command": "echo hi; mkdir -p /workspace/out; echo r > /workspace/out/r.txt"});
    c.tool(thread, "execute_command", cmd).expect(200);
    c.tool(thread, "execute_command", json!({"environment_id": "env_none", "command": "true"}))
        .expect_code(404, "environment_not_found");
    let p = c
        .tool(thread, "start_process", json!({"environment_id": env_id, "command": "echo started; sleep 300"}))
        .expect(200);
    let pid = s(&p, "process_id");
    c.tool(thread, "start_process", json!({"environment_id": "env_none", "command": "true"}))
        .expect_code(404, "environment_not_found");
    c.tool(thread, "check_process", json!({"process_id": pid})).expect(200);
    c.tool(thread, "check_process", json!({"process_id": "proc_none"})).expect_code(404, "process_not_found");
    c.tool(thread, "list_processes", json!({"environment_id": env_id})).expect(200);
    c.tool(thread, "list_processes", json!({"bogus": 1})).expect_code(400, "invalid_request");
    c.tool(thread, "stop_process", json!({"process_id": pid})).expect(200);
    c.tool(thread, "stop_process", json!({"process_id": "proc_none"})).expect_code(404, "process_not_found");
    let destroy = json!({"environment_id": env_id, "persist_outputs": true, "output_paths": ["/workspace/out"]});
    c.tool(thread, "destroy_environment", destroy.clone()).expect(200);
    c.tool(thread, "destroy_environment", destroy).expect(200);
    c.tool(thread, "destroy_environment", json!({"environment_id": "env_none"}))
        .expect_code(404, "environment_not_found");
    c.tool(thread, "execute_command", json!({"environment_id": env_id, "command": "true"})).expect_status();
    env_id
}

/// `/admin/*`: accounts, usage and settlement of `env_id`'s usage, the audit log, nodes.
fn admin_routes(c: &mut Checker, env_id: &str) {
    c.call("GET", "/admin/nodes", "/admin/nodes", Ask::admin()).expect(200);
    c.call("GET", "/admin/nodes", "/admin/nodes", Ask::new()).expect_code(401, "unauthorized");
    let account = "/admin/accounts/{user_id}";
    c.call("GET", account, "/admin/accounts/user-1", Ask::admin()).expect(200);
    c.call("GET", account, "/admin/accounts/nobody-at-all", Ask::admin()).expect_code(404, "account_not_found");
    let credit = "/admin/accounts/{user_id}/credit";
    let cb = json!({"amount": "10.000000", "idempotency_key": "credit-1"});
    c.call("POST", credit, "/admin/accounts/user-1/credit", Ask::admin().json(cb)).expect(200);
    let other = json!({"amount": "11.000000", "idempotency_key": "credit-1"});
    c.call("POST", credit, "/admin/accounts/user-1/credit", Ask::admin().json(other))
        .expect_code(409, "idempotency_key_conflict");
    let float = json!({"amount": 10.5, "idempotency_key": "credit-2"});
    c.call("POST", credit, "/admin/accounts/user-1/credit", Ask::admin().json(float)).expect_code(400, "invalid_json");
    let plan = "/admin/accounts/{user_id}/plan";
    c.call("PUT", plan, "/admin/accounts/user-1/plan", Ask::admin().json(json!({"plan": "pro"}))).expect(200);
    c.call("PUT", plan, "/admin/accounts/user-1/plan", Ask::admin().json(json!({"plan": "gold"})))
        .expect_code(400, "unknown_plan");
    let adj = "/admin/accounts/{user_id}/quota-adjustment";
    c.call("PUT", adj, "/admin/accounts/user-1/quota-adjustment", Ask::admin().json(json!({"minutes": 5}))).expect(200);
    let huge = json!({"minutes": 99_999_999});
    c.call("PUT", adj, "/admin/accounts/user-1/quota-adjustment", Ask::admin().json(huge))
        .expect_code(400, "invalid_request");
    let ledger = "/admin/accounts/{user_id}/ledger";
    c.call("GET", ledger, "/admin/accounts/user-1/ledger?limit=10", Ask::admin()).expect(200);
    c.call("GET", ledger, "/admin/accounts/user-1/ledger?limit=0", Ask::admin()).expect_code(400, "invalid_request");

    let pending = "/admin/pending-usage";
    let mut usage_id = None;
    wait_until("the environment's usage record", || {
        let page = c.call("POST", pending, pending, Ask::admin().json(json!({"settled": 0}))).expect(200);
        let settled = c.call("POST", pending, pending, Ask::admin().json(json!({"settled": 1}))).expect(200);
        let all = page["usage"].as_array().unwrap().iter().chain(settled["usage"].as_array().unwrap());
        usage_id = all.clone().find(|u| u["environment_id"] == env_id).and_then(|u| u["id"].as_i64());
        usage_id.is_some()
    });
    c.call("POST", pending, pending, Ask::admin().json(json!({"settled": 7}))).expect_code(400, "invalid_request");
    let registered = "/admin/mark-artifacts-registered";
    c.call("POST", registered, registered, Ask::admin().json(json!({"environment_id": env_id}))).expect(200);
    c.call("POST", registered, registered, Ask::admin().json(json!({"environment_id": "env_none"})))
        .expect_code(404, "usage_not_found");
    c.call("POST", registered, registered, Ask::admin().json(json!({}))).expect_code(400, "invalid_request");
    let settle = "/admin/mark-settled";
    c.call("POST", settle, settle, Ask::admin().json(json!({"usage_ids": [usage_id.unwrap(), 999_999]}))).expect(200);
    c.call("POST", settle, settle, Ask::admin().json(json!({"usage_ids": []}))).expect_code(400, "invalid_request");
    let audit = "/admin/audit-log";
    c.call("GET", audit, "/admin/audit-log?limit=5", Ask::admin()).expect(200);
    c.call("GET", audit, "/admin/audit-log?limit=x", Ask::admin()).expect_code(400, "invalid_query");
}

/// The admin page's rows (`text/html`, a session cookie): each called without a session (a 303 to
/// the login form, or the form's own answers), then every page with the session a login made,
/// and the login's and logout's refusals.
fn admin_ui_routes(c: &mut Checker) {
    const FORM: &str = "application/x-www-form-urlencoded";
    for (method, path) in c.paths_under("/admin/ui") {
        let concrete = path.replace("{user_id}", "user-1").replace("{scope_id}", "scp_none");
        c.call(&method, &path, &concrete, Ask::new()).expect_status();
    }
    let login = "/admin/ui/login";
    let form = |token: &str| format!("token={token}").into_bytes();
    c.call("POST", login, login, Ask::new().raw(FORM, form("not-the-token"))).expect(401);
    let cross_site = Ask::new().raw(FORM, form(ADMIN_TOKEN)).header("Sec-Fetch-Site", "cross-site");
    c.call("POST", login, login, cross_site).expect(403);
    let signed_in = c.call("POST", login, login, Ask::new().raw(FORM, form(ADMIN_TOKEN)));
    let cookie = signed_in.cookie.clone().expect("a login sets the session cookie");
    signed_in.expect(303);
    let with = || Ask::new().header("Cookie", &cookie);
    for (method, path) in c.paths_under("/admin/ui") {
        if method != "GET" || path == login || path.ends_with(".css") || path.contains('{') {
            continue;
        }
        c.call("GET", &path, &path, with()).expect(200);
    }
    let user = "/admin/ui/accounts/{user_id}";
    c.call("GET", user, "/admin/ui/accounts/user-1", with()).expect_status();
    c.call("GET", user, "/admin/ui/accounts/nobody-here", with()).expect(404);
    let scope = "/admin/ui/scopes/{scope_id}";
    c.call("GET", scope, "/admin/ui/scopes/not-a-scope-id", with()).expect(400);
    let logout = "/admin/ui/logout";
    c.call("POST", logout, logout, with().raw(FORM, b"csrf=forged".to_vec())).expect(403);
}
