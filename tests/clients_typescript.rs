//! Issue 25, item 4 and acceptance b: the TypeScript client (`clients/typescript`) against a live
//! daemon. Its route types are generated from the daemon's `/openapi.json` by `openapi-typescript`;
//! this test generates them again from the running daemon and fails when the committed
//! `src/schema.ts` differs (stale types), then builds the package and runs its `node --test` suite.

pub mod serve_process;

use std::path::{Path, PathBuf};
use std::process::Command;

use serve_process::{client, free_port, write_config, ServeProcess};

const TOKEN: &str = "ts-client-service-token";

fn package_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/typescript")
}

/// Runs `program args` in `dir` with `env`; fails the test with its output unless it succeeds.
fn run(dir: &Path, program: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("{program} could not start ({e}): Node.js 20 and npm come with the machine"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{program} {args:?} failed ({}):\n{text}", out.status);
    text
}

fn node_major() -> u32 {
    let v = run(Path::new("."), "node", &["--version"], &[]);
    v.trim().trim_start_matches('v').split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0)
}

#[test]
fn the_typescript_client_suite_passes_against_a_live_daemon_with_fresh_types() {
    assert!(node_major() >= 20, "the TypeScript client needs Node.js >= 20");
    let pkg = package_dir();
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("clients_typescript");
    std::fs::create_dir_all(&out_dir).unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(tmp.path(), port, &format!("service_token = {TOKEN:?}\n\n[store]\nkind = \"local\"\n"));
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "daemon.log", &[]);
    let http = client();
    daemon.wait_ready(&http);

    // The package's tools, exactly as locked (no resolved addresses in the lock: the configured
    // registry serves them).
    run(&pkg, "npm", &["ci", "--no-audit", "--no-fund"], &[]);

    // Types generated from the live document must be the committed ones.
    let doc = http.get(format!("{}/openapi.json", daemon.base)).send().unwrap().text().unwrap();
    let doc_path = out_dir.join("openapi.json");
    let fresh = out_dir.join("schema.ts");
    std::fs::write(&doc_path, doc).unwrap();
    let generator = pkg.join("node_modules/.bin/openapi-typescript");
    // Fields with a default are optional in a request (the generator's default makes them required).
    let args = [doc_path.to_str().unwrap(), "--default-non-nullable", "false", "-o", fresh.to_str().unwrap()];
    run(&pkg, generator.to_str().unwrap(), &args, &[]);
    let committed = std::fs::read_to_string(pkg.join("src/schema.ts")).unwrap();
    assert!(
        std::fs::read_to_string(&fresh).unwrap() == committed,
        "clients/typescript/src/schema.ts is stale: the daemon's /openapi.json changed. Update it with \
         `cp {} clients/typescript/src/schema.ts` (made by `openapi-typescript DOC --default-non-nullable false`)",
        fresh.display()
    );

    run(&pkg, "npm", &["run", "build"], &[]);
    let url = daemon.base.clone();
    // The secret the daemon generated on its first start (the signer's live test signs with it).
    let secret = std::fs::read_to_string(tmp.path().join("data/control/hmac-secret")).unwrap();
    let env = [("SCOPEFS_URL", url.as_str()), ("SCOPEFS_SERVICE_TOKEN", TOKEN), ("SCOPEFS_HMAC_SECRET", secret.trim())];
    let report = run(&pkg, "node", &["--test", "dist/test/"], &env);
    let count = |key: &str| -> u32 {
        report
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# {key} ")))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("node --test printed no '# {key}' line:\n{report}"))
    };
    let (passed, failed) = (count("pass"), count("fail"));
    assert_eq!(failed, 0, "{report}");
    assert!(passed >= 9, "the suite ran {passed} tests:\n{report}");

    // The README quickstart's step 4: the example lists a thread's files.
    let thread = "quickstart-ts";
    let provision = http
        .post(format!("{url}/internal/workspace-scopes/provision"))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"operation_id": "op-quickstart-ts", "primary_thread_id": thread}))
        .send()
        .unwrap();
    assert!(provision.status().is_success(), "provision: {}", provision.status());
    let put = http
        .put(format!("{url}/api/workspace/file?threadId={thread}&path=hello.txt"))
        .bearer_auth(TOKEN)
        .body("hello\n")
        .send()
        .unwrap();
    assert!(put.status().is_success(), "write: {}", put.status());
    let listed = run(
        &pkg,
        "node",
        &["dist/examples/list.js", thread],
        &[("SCOPEFS_URL", url.as_str()), ("SCOPEFS_SERVICE_TOKEN", TOKEN)],
    );
    assert!(listed.contains("listed through the TypeScript client") && listed.contains(" 6 /hello.txt"), "{listed}");
    daemon.stop(std::time::Duration::from_secs(20));
    println!(
        "summary: typescript client: {passed} node tests passed against a live daemon; types current; list example ok"
    );
}
