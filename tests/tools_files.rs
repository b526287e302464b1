//! The signed file tools against the real daemon (issue 4, acceptance h and basics): edit_file's
//! uniqueness rule, grep/glob/list_dir confined to the scope whatever the pattern (including symlinks
//! made through the FUSE mount that point elsewhere), per-scope isolation, thread owners, limits.

pub mod tools_support;
pub mod workspace_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tools_support::{call, call_scoped, peak_rss_kib, start_daemon};
use workspace_support::{Answer, Daemon, MAX_UPLOAD};

fn ok(a: Answer) -> Value {
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    a.json()
}

fn write(d: &Daemon, thread: &str, path: &str, content: &str) {
    ok(call(d, "write_file", thread, json!({"path": path, "content": content})));
}

fn read(d: &Daemon, thread: &str, path: &str) -> Answer {
    call(d, "read_file", thread, json!({"path": path}))
}

fn status_code(a: &Answer) -> (StatusCode, String) {
    (a.status, a.code())
}

/// Every `/workspace/...` path in a JSON answer.
fn paths_in(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) if s.starts_with('/') => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|i| paths_in(i, out)),
        Value::Object(map) => map.values().for_each(|i| paths_in(i, out)),
        _ => {}
    }
}

#[test]
fn edit_file_needs_a_unique_old_string_unless_replace_all() {
    let d = start_daemon(&[]);
    d.provision("thr_edit");
    write(&d, "thr_edit", "/workspace/src/main.py", "x = 1\nprint(x)\nx = 1\n");

    let dup =
        call(&d, "edit_file", "thr_edit", json!({"path": "src/main.py", "old_string": "x = 1", "new_string": "x = 2"}));
    assert_eq!(status_code(&dup), (StatusCode::CONFLICT, "old_string_not_unique".into()), "{}", dup.text());
    assert_eq!(
        ok(read(&d, "thr_edit", "src/main.py"))["content"],
        "x = 1\nprint(x)\nx = 1\n",
        "a refused edit changes nothing"
    );

    let missing =
        call(&d, "edit_file", "thr_edit", json!({"path": "src/main.py", "old_string": "y = 1", "new_string": "z"}));
    assert_eq!(status_code(&missing), (StatusCode::CONFLICT, "old_string_not_found".into()));
    let empty = call(&d, "edit_file", "thr_edit", json!({"path": "src/main.py", "old_string": "", "new_string": "z"}));
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);

    let unique = ok(call(
        &d,
        "edit_file",
        "thr_edit",
        json!({"path": "/workspace/src/main.py", "old_string": "print(x)", "new_string": "print(x + 1)"}),
    ));
    assert_eq!(unique["replacements"], 1);
    let all = ok(call(
        &d,
        "edit_file",
        "thr_edit",
        json!({"path": "src/main.py", "old_string": "x = 1", "new_string": "x = 2", "replace_all": true}),
    ));
    assert_eq!((all["replacements"].as_u64(), all["path"].as_str()), (Some(2), Some("/workspace/src/main.py")));
    assert_eq!(ok(read(&d, "thr_edit", "src/main.py"))["content"], "x = 2\nprint(x + 1)\nx = 2\n");
    let absent = call(&d, "edit_file", "thr_edit", json!({"path": "nope.py", "old_string": "a", "new_string": "b"}));
    assert_eq!(status_code(&absent), (StatusCode::NOT_FOUND, "file_not_found".into()));
}

#[test]
fn grep_glob_and_list_never_leave_the_scope() {
    let d = start_daemon(&[]);
    let scope_a = d.provision("thr_a");
    let scope_b = d.provision("thr_b");
    write(&d, "thr_a", "notes/a.txt", "alpha NEEDLE here\nnothing\n");
    write(&d, "thr_a", "top.py", "print('NEEDLE')\n");
    write(&d, "thr_b", "secret-b.txt", "NEEDLE of B\n");

    // Symlinks through A's mount: any target is allowed (to /, to B's mount, to the host, above the
    // root, a cycle to the root, to itself, to a directory); the tools list them but never follow
    // one, and the host view of the mount does not follow them either.
    let mnt_a = d.mountpoint(&scope_a);
    let mnt_b = d.mountpoint(&scope_b);
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("host.txt"), "NEEDLE on the host\n").unwrap();
    for (target, link) in [
        (std::path::PathBuf::from("/"), "to-root"),
        (mnt_b.clone(), "to-b"),
        (host.path().to_path_buf(), "to-host"),
        (std::path::PathBuf::from("../../x"), "notes/escape"),
    ] {
        std::os::unix::fs::symlink(&target, mnt_a.join(link)).unwrap_or_else(|e| panic!("{link}: {e}"));
    }
    std::os::unix::fs::symlink("..", mnt_a.join("notes/up")).unwrap();
    std::os::unix::fs::symlink("notes", mnt_a.join("to-notes")).unwrap();
    std::os::unix::fs::symlink("loop", mnt_a.join("loop")).unwrap();
    let through = std::fs::read_to_string(mnt_a.join("notes/up/top.py")).unwrap_err();
    assert_eq!(through.raw_os_error(), Some(libc::ELOOP), "the host view followed a symlink");
    let through = std::fs::read_to_string(mnt_a.join("to-b/secret-b.txt")).unwrap_err();
    assert_eq!(through.raw_os_error(), Some(libc::ELOOP), "the host view followed a symlink");

    let own: BTreeSet<String> = ["/workspace/notes/a.txt", "/workspace/top.py"].iter().map(|s| s.to_string()).collect();
    let entries: BTreeSet<String> = [
        "/workspace/loop",
        "/workspace/notes",
        "/workspace/notes/a.txt",
        "/workspace/notes/escape",
        "/workspace/notes/up",
        "/workspace/to-b",
        "/workspace/to-host",
        "/workspace/to-notes",
        "/workspace/to-root",
        "/workspace/top.py",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();

    // grep finds A's own matches only, whatever the starting directory or file filter.
    for (path, glob) in [("/workspace", None), (".", Some("**/*")), ("/workspace/", Some("*")), ("notes", None)] {
        let mut params = json!({"pattern": "NEEDLE", "path": path});
        if let Some(g) = glob {
            params["glob"] = json!(g);
        }
        let v = ok(call(&d, "grep_files", "thr_a", params));
        let found: BTreeSet<String> =
            v["matches"].as_array().unwrap().iter().map(|m| m["path"].as_str().unwrap().to_string()).collect();
        assert!(!found.is_empty() && found.is_subset(&own), "{path} {glob:?}: {found:?}");
        assert!(!v.to_string().contains("of B") && !v.to_string().contains("host"), "{v}");
    }
    // glob: every pattern stays within A's own entries, symlinks listed but never entered.
    for pattern in
        ["**/*", "**", "*", "**/*.txt", "to-*/*", "to-b/**", "notes/up/*", "notes/up/**/*", "**/secret-b.txt"]
    {
        let v = ok(call(&d, "glob_files", "thr_a", json!({"pattern": pattern})));
        let mut got = Vec::new();
        paths_in(&v["matches"], &mut got);
        let got: BTreeSet<String> = got.into_iter().collect();
        assert!(got.is_subset(&entries), "{pattern}: {got:?}");
        if pattern == "**/*" {
            assert_eq!(got, entries);
        }
    }
    for pattern in ["../*", "../../**", "/etc/*", "**/../*", "notes/../../*", "/workspace/../*"] {
        let a = call(&d, "glob_files", "thr_a", json!({"pattern": pattern}));
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{pattern}: {}", a.text());
    }
    // list_dir, grep and read through a symlink never follow it.
    for path in ["to-notes", "notes/up", "loop", "to-root", "to-b", "to-host", "notes/escape"] {
        let l = call(&d, "list_dir", "thr_a", json!({"path": path}));
        assert!(l.status.is_client_error(), "list_dir {path}: {}", l.text());
        let g = call(&d, "grep_files", "thr_a", json!({"pattern": "NEEDLE", "path": path}));
        assert!(g.status.is_client_error() || g.json()["matches"].as_array().unwrap().is_empty(), "{}", g.text());
    }
    for path in [
        "to-notes/a.txt",
        "notes/up/top.py",
        "loop",
        "to-notes",
        "to-root/etc/hostname",
        "to-b/secret-b.txt",
        "to-host",
    ] {
        assert_eq!(read(&d, "thr_a", path).status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(call(&d, "download_file", "thr_a", json!({"remote_path": path})).status, StatusCode::NOT_FOUND);
    }
    let root = ok(call(&d, "list_dir", "thr_a", json!({})));
    let names: Vec<&str> = root["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["loop", "notes", "to-b", "to-host", "to-notes", "to-root", "top.py"]);
    assert_eq!(root["entries"][0]["type"], "symlink");

    // Paths outside the workspace are refused by every tool.
    let bad = [
        "../x",
        "/etc/passwd",
        "/workspace/../x",
        "notes/../../x",
        "a\u{1}b",
        "/.control/x",
        ".control",
        "C:/x",
        "a\\b",
    ];
    for path in bad {
        for (tool, params) in [
            ("read_file", json!({"path": path})),
            ("list_dir", json!({"path": path})),
            ("write_file", json!({"path": path, "content": "x"})),
            ("grep_files", json!({"pattern": "x", "path": path})),
            ("glob_files", json!({"pattern": "*", "path": path})),
            ("download_file", json!({"remote_path": path})),
        ] {
            let a = call(&d, tool, "thr_a", params);
            assert_eq!(a.status, StatusCode::BAD_REQUEST, "{tool} {path:?}: {}", a.text());
        }
    }
    // Nothing was written outside A by any of that, and B is untouched.
    assert!(!host.path().join("x").exists());
    assert_eq!(d.listing("thr_b"), vec![("secret-b.txt".to_string(), "file".to_string(), 12)]);
}

#[test]
fn scopes_are_isolated_and_threads_bind_through_owners() {
    let d = start_daemon(&[]);
    let scope_a = d.provision("thr_iso_a");
    d.provision("thr_iso_b");
    write(&d, "thr_iso_a", "only-a.txt", "A's data");

    // B's paths resolve in B only.
    let cross = read(&d, "thr_iso_b", "/workspace/only-a.txt");
    assert_eq!(status_code(&cross), (StatusCode::NOT_FOUND, "file_not_found".into()));
    assert!(ok(call(&d, "list_dir", "thr_iso_b", json!({})))["entries"].as_array().unwrap().is_empty());
    let g = ok(call(&d, "grep_files", "thr_iso_b", json!({"pattern": "A's"})));
    assert!(g["matches"].as_array().unwrap().is_empty());
    write(&d, "thr_iso_b", "only-a.txt", "B's own");
    assert_eq!(ok(read(&d, "thr_iso_a", "only-a.txt"))["content"], "A's data");

    // An unknown thread is refused after its signature verified.
    let unknown = call(&d, "read_file", "thr_nobody", json!({"path": "only-a.txt"}));
    assert_eq!(status_code(&unknown), (StatusCode::NOT_FOUND, "scope_not_found".into()));

    // A child thread registered as A's async_thread owner acts in A; a memory worker reads only.
    let owner = |resource: &str, ty: &str| {
        let a = d.send(
            d.client
                .post(d.url(&format!("/internal/workspace-scopes/{scope_a}/owners")))
                .json(&json!({"owner_type": ty, "resource_id": resource})),
        );
        assert!(a.status.is_success(), "{}", a.text());
    };
    owner("thr_child", "async_thread");
    owner("thr_memory", "memory_worker");
    assert_eq!(ok(read(&d, "thr_child", "only-a.txt"))["content"], "A's data");
    write(&d, "thr_child", "from-child.txt", "child");
    assert_eq!(ok(read(&d, "thr_iso_a", "from-child.txt"))["content"], "child");
    assert_eq!(ok(read(&d, "thr_memory", "only-a.txt"))["content"], "A's data");
    let denied = call(&d, "write_file", "thr_memory", json!({"path": "m.txt", "content": "x"}));
    assert_eq!(status_code(&denied), (StatusCode::FORBIDDEN, "read_only".into()));
}

/// Issue 24, item 1 (seed 000 §4, §16.3: conversation A's tools cannot see B's files): by default
/// (`peer_views = "granted"`) a signed tool request reaches another thread of the same user, or the
/// user's global store, only when its signed `object_scope` names the path; `peer_views = "open"`
/// lets every request of the user read them. At 2351eb5 the ungranted read answered 200.
#[test]
fn conversations_read_each_other_only_under_a_signed_grant() {
    let signed = |d: &Daemon, tool: &str, params: Value, grant: Option<Value>| {
        let a = match &grant {
            Some(g) => call_scoped(d, tool, "thr_conv_a", params, g),
            None => call(d, tool, "thr_conv_a", params),
        };
        let v = a.json();
        (a.status, v["error"]["code"].as_str().unwrap_or_default().to_string(), v)
    };
    for (peer_views, open) in [(None, false), (Some("open"), true)] {
        let env: Vec<(&str, &str)> = peer_views.map(|v| ("SCOPEFS_PEER_VIEWS", v)).into_iter().collect();
        let d = start_daemon(&env);
        d.provision("thr_conv_a");
        d.provision("thr_conv_b");
        write(&d, "thr_conv_b", "secret.txt", "B's notes");
        write(&d, "thr_conv_a", "mine.txt", "A's notes");
        let secret = "/threads/thr_conv_b/secret.txt";
        // The route and body a tool of conversation A would send (no object_scope: the seed's
        // gateway adds one only when it has one).
        let attempts = [
            ("read_file", json!({"path": secret})),
            ("download_file", json!({"remote_path": secret})),
            ("list_dir", json!({"path": "/threads/thr_conv_b"})),
            ("grep_files", json!({"pattern": "notes", "path": "/threads/thr_conv_b"})),
            ("glob_files", json!({"pattern": "*.txt", "path": "/threads/thr_conv_b"})),
            ("list_dir", json!({"path": "/__global__"})),
        ];
        for (tool, params) in attempts {
            let (status, code, v) = signed(&d, tool, params, None);
            if open {
                assert_eq!(status, StatusCode::OK, "peer_views = open, {tool}: {v}");
            } else {
                assert_eq!((status, code.as_str()), (StatusCode::FORBIDDEN, "object_scope_denied"), "{tool}: {v}");
            }
        }
        // A signed grant naming the path opens it; one naming something else does not.
        let (status, _, v) = signed(&d, "read_file", json!({"path": secret}), Some(json!({"read": [secret]})));
        assert_eq!((status, v["content"].as_str()), (StatusCode::OK, Some("B's notes")), "{v}");
        let elsewhere = Some(json!({"read": ["/workspace", "/threads/thr_conv_b/other.txt"]}));
        let (status, code, v) = signed(&d, "read_file", json!({"path": secret}), elsewhere);
        assert_eq!((status, code.as_str()), (StatusCode::FORBIDDEN, "object_scope_denied"), "{v}");
        // The request's own workspace needs no grant.
        assert_eq!(ok(read(&d, "thr_conv_a", "/workspace/mine.txt"))["content"], "A's notes");
    }
}

#[test]
fn upload_download_limits_and_quota() {
    let d = start_daemon(&[]);
    d.provision("thr_up");
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let b64 = b64(&data);
    let sha = hex::encode(Sha256::digest(&data));
    let up = ok(call(
        &d,
        "upload_file",
        "thr_up",
        json!({"remote_path": "/workspace/bin/data.bin", "content_base64": b64, "sha256": sha}),
    ));
    assert_eq!((up["size_bytes"].as_u64(), up["sha256"].as_str()), (Some(70_000), Some(sha.as_str())));
    let down = ok(call(&d, "download_file", "thr_up", json!({"remote_path": "bin/data.bin"})));
    assert_eq!((down["content_base64"].as_str(), down["sha256"].as_str()), (Some(b64.as_str()), Some(sha.as_str())));
    let binary = read(&d, "thr_up", "bin/data.bin");
    assert_eq!(status_code(&binary), (StatusCode::CONFLICT, "not_utf8".into()));

    let wrong =
        call(&d, "upload_file", "thr_up", json!({"remote_path": "w.bin", "content_base64": b64, "sha256": "00"}));
    assert_eq!(status_code(&wrong), (StatusCode::BAD_REQUEST, "sha256_mismatch".into()));
    let garbage =
        call(&d, "upload_file", "thr_up", json!({"remote_path": "w.bin", "content_base64": "%%%", "sha256": sha}));
    assert_eq!(status_code(&garbage), (StatusCode::BAD_REQUEST, "invalid_base64".into()));
    assert_eq!(read(&d, "thr_up", "w.bin").status, StatusCode::NOT_FOUND, "refused uploads leave nothing");

    // Over the per-request file limit: 413, nothing written.
    let big = "x".repeat(MAX_UPLOAD + 1);
    let too_big = call(&d, "write_file", "thr_up", json!({"path": "big.txt", "content": big}));
    assert_eq!(too_big.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", too_big.text());
    assert_eq!(read(&d, "thr_up", "big.txt").status, StatusCode::NOT_FOUND);

    // Quota (2.5 MiB): the third full-size file is 507.
    let full = "y".repeat(MAX_UPLOAD);
    write(&d, "thr_up", "q1.txt", &full);
    write(&d, "thr_up", "q2.txt", &full);
    let over = call(&d, "write_file", "thr_up", json!({"path": "q3.txt", "content": full}));
    assert_eq!(status_code(&over), (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded".into()), "{}", over.text());
}

/// Standard base64 with padding.
fn b64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            out.push(if i <= c.len() { A[(n >> (18 - 6 * i)) as usize & 63] as char } else { '=' });
        }
    }
    out
}

#[test]
fn replace_all_over_the_limit_is_refused_before_it_is_built() {
    let d = start_daemon(&[]);
    d.provision("thr_blowup");
    let content = "a".repeat(1_000_000);
    write(&d, "thr_blowup", "a.txt", &content);
    let before = peak_rss_kib(d.pid());
    let started = Instant::now();
    // 10^6 matches × 999 more bytes: a 1 GB result, which the old code built before its size check.
    let a = call(
        &d,
        "edit_file",
        "thr_blowup",
        json!({"path": "a.txt", "old_string": "a", "new_string": "b".repeat(1000), "replace_all": true}),
    );
    assert_eq!(status_code(&a), (StatusCode::PAYLOAD_TOO_LARGE, "too_large".into()), "{}", a.text());
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    let grown = peak_rss_kib(d.pid()).saturating_sub(before);
    assert!(grown < 200 * 1024, "peak RSS grew by {grown} KiB");
    // The daemon is alive and the file unchanged; an edit that fits still works.
    assert_eq!(ok(read(&d, "thr_blowup", "a.txt"))["content"].as_str(), Some(content.as_str()));
    let fits = ok(call(
        &d,
        "edit_file",
        "thr_blowup",
        json!({"path": "a.txt", "old_string": "a", "new_string": "", "replace_all": true}),
    ));
    assert_eq!((fits["replacements"].as_u64(), fits["size_bytes"].as_u64()), (Some(1_000_000), Some(0)));
}

#[test]
fn glob_and_grep_stay_cheap_on_deep_trees_and_long_patterns() {
    let d = start_daemon(&[]);
    d.provision("thr_deep");
    // A 300-deep chain: the old matcher tried every split per `**` (~depth^5/120 steps per walk).
    let deep = format!("{}f.txt", "d/".repeat(300));
    write(&d, "thr_deep", &deep, "needle here\n");
    write(&d, "thr_deep", "top.txt", "no\nneedle\n");
    let started = Instant::now();
    let none = ok(call(&d, "glob_files", "thr_deep", json!({"pattern": "**/**/**/**/nomatch"})));
    assert_eq!((none["matches"].clone(), none["truncated"].clone()), (json!([]), json!(false)));
    let some = ok(call(&d, "glob_files", "thr_deep", json!({"pattern": "**/d/**/d/**/f.txt"})));
    assert_eq!(some["matches"], json!([format!("/workspace/{deep}")]));
    let tops = ok(call(&d, "glob_files", "thr_deep", json!({"pattern": "*.txt"})));
    assert_eq!(tops["matches"], json!(["/workspace/top.txt"]));
    let found = ok(call(&d, "grep_files", "thr_deep", json!({"pattern": "needle"})));
    let mut hits: Vec<(String, u64)> = found["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["path"].as_str().unwrap().to_string(), m["line_number"].as_u64().unwrap()))
        .collect();
    hits.sort();
    assert_eq!(hits, vec![(format!("/workspace/{deep}"), 1), ("/workspace/top.txt".into(), 2)]);
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());

    // Patterns over `grep_max_pattern_bytes` / `glob_max_pattern_bytes` (1 KiB) are 413.
    let long = call(&d, "grep_files", "thr_deep", json!({"pattern": "x".repeat(1025)}));
    assert_eq!(status_code(&long), (StatusCode::PAYLOAD_TOO_LARGE, "too_large".into()), "{}", long.text());
    let long = call(&d, "glob_files", "thr_deep", json!({"pattern": "*".repeat(1025)}));
    assert_eq!(status_code(&long), (StatusCode::PAYLOAD_TOO_LARGE, "too_large".into()), "{}", long.text());
    let fits = call(&d, "grep_files", "thr_deep", json!({"pattern": "x".repeat(1024)}));
    assert_eq!(fits.status, StatusCode::OK, "{}", fits.text());
}

#[test]
fn search_answers_are_bounded_in_bytes_and_say_they_were_cut() {
    let d = start_daemon(&[]);
    d.provision("thr_long");
    // 200 files below a 12 KiB directory path: their paths alone are 2.4 MiB of answer, past the
    // 2 MiB a grep or glob answer holds.
    let dir = vec!["a".repeat(200); 60].join("/");
    for i in 0..200 {
        write(&d, "thr_long", &format!("{dir}/f{i:03}.txt"), "needle\n");
    }
    let prefix = format!("/workspace/{dir}/f");
    for (tool, params, key) in [
        ("glob_files", json!({"pattern": "**/f*.txt"}), None),
        ("grep_files", json!({"pattern": "needle"}), Some("path")),
    ] {
        let a = call(&d, tool, "thr_long", params);
        assert_eq!(a.status, StatusCode::OK, "{tool}: {}", a.text());
        let bytes = a.text().len();
        let v = ok(a);
        let matches = v["matches"].as_array().unwrap();
        let paths: Vec<&str> = matches.iter().map(|m| key.map_or(m, |k| &m[k]).as_str().unwrap()).collect();
        assert!(paths.iter().all(|p| p.starts_with(&prefix)), "{tool}: a path outside the files written");
        assert_eq!(
            v["truncated"],
            json!(true),
            "{tool}: {} matches in {bytes} bytes, not marked truncated",
            paths.len()
        );
        assert!(paths.len() >= 150 && paths.len() < 200, "{tool}: {} matches", paths.len());
        assert!(bytes <= (2 << 20) + 4096, "{tool}: answer of {bytes} bytes");
    }
}
