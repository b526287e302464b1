//! Acceptance d of issue 6: after an end-to-end run (provision, upload, read, signed tool calls,
//! writes and refused attempts through the mount, shutdown) with debug logging in both formats,
//! the daemon's log contains no token or secret, no file content and no physical path under the
//! data directory.

pub mod tools_support;
pub mod workspace_support;

use reqwest::StatusCode;
use serde_json::json;
use tools_support::{call, start_daemon, SECRET};
use workspace_support::{Daemon, TOKEN};

/// Content markers that must never reach a log line.
const UPLOADED: &str = "UPLOADED-CONTENT-8c1e5f";
const TOOL_WRITTEN: &str = "TOOL-WRITTEN-CONTENT-2b7d90";
const FUSE_WRITTEN: &str = "FUSE-WRITTEN-CONTENT-e44a13";

fn end_to_end(d: &mut Daemon, thread: &str) {
    let scope = d.provision(thread);
    let a = d.upload(thread, "notes.txt", format!("{UPLOADED}\n").into_bytes(), "");
    assert!(a.status.is_success(), "upload: {} {}", a.status, a.text());
    let a = d.read(thread, "notes.txt");
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.text().contains(UPLOADED));
    // A refused API path.
    assert!(!d.read(thread, "../../etc/passwd").status.is_success());

    let w = call(d, "write_file", thread, json!({"path": "src/app.py", "content": TOOL_WRITTEN}));
    assert_eq!(w.status, StatusCode::OK, "{}", w.text());
    let r = call(d, "read_file", thread, json!({"path": "src/app.py"}));
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(r.text().contains(TOOL_WRITTEN));
    let bad = call(d, "read_file", thread, json!({"path": "/etc/shadow"}));
    assert!(!bad.status.is_success(), "{}", bad.text());

    let mp = d.mountpoint(&scope);
    std::fs::write(mp.join("fuse.txt"), FUSE_WRITTEN).unwrap();
    assert_eq!(std::fs::read_to_string(mp.join("fuse.txt")).unwrap(), FUSE_WRITTEN);
    std::os::unix::fs::symlink("/etc/passwd", mp.join("escape")).unwrap();
    assert!(std::fs::write(mp.join(".secrets"), FUSE_WRITTEN).is_err());
    let _ = std::fs::read(mp.join("missing.txt"));
    d.stop();
}

fn check_log(d: &Daemon, format: &str) {
    let log = d.log_text();
    assert!(log.lines().count() > 5, "{format}: suspiciously short log (is logging on?):\n{log}");
    let data_dir = d.dir.path().join("data").to_string_lossy().into_owned();
    let forbidden = [
        ("the service token", TOKEN),
        ("the HMAC secret", SECRET),
        ("uploaded file content", UPLOADED),
        ("tool-written file content", TOOL_WRITTEN),
        ("FUSE-written file content", FUSE_WRITTEN),
        ("a physical path under the data directory", data_dir.as_str()),
    ];
    for (what, needle) in forbidden {
        if let Some(line) = log.lines().find(|l| l.contains(needle)) {
            panic!("{format} log contains {what}:\n{line}");
        }
    }
    let admin = std::fs::read_to_string(d.dir.path().join("data/control/admin-token")).unwrap();
    assert!(!log.contains(admin.trim()), "{format} log contains the admin token");
}

#[test]
fn logs_hold_no_secret_content_or_physical_path_after_an_end_to_end_run() {
    for format in ["text", "json"] {
        let mut d =
            start_daemon(&[("SCOPEFS_LOG", "debug,fuser=warn,hyper=info,h2=info"), ("SCOPEFS_LOG_FORMAT", format)]);
        end_to_end(&mut d, &format!("logs-{format}"));
        check_log(&d, format);
    }
}
