//! Acceptance i of issue 3: the WebUI's whole conversation, against the real daemon — new chat →
//! draft scope → upload before the first message → the first run reservation activates the scope →
//! files listed, previewed (range), edited, downloaded as a zip → delete → the files answer 404.

pub mod workspace_support;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use workspace_support::{Daemon, Part};

const THREAD: &str = "chat-e2e-0001";

fn by_thread(d: &Daemon) -> Value {
    let a = d.get(&format!("/internal/workspace-scopes/by-thread/{THREAD}"));
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    a.json()
}

#[test]
fn a_conversation_from_new_chat_to_delete() {
    // Short drain bound: the test's run is settled before the delete anyway.
    let d = Daemon::start_with_env(&[("SCOPEFS_DELETE_DRAIN_SECS", "5")]);

    // New chat: the WebUI server provisions the thread's scope; it starts as a draft.
    let scope = d.provision(THREAD);
    assert_eq!(by_thread(&d)["state"], "draft");
    // Nothing exists yet, and the listing says so without naming any directory.
    let empty = d.send(d.client.get(d.url("/api/workspace")).query(&[("threadId", THREAD)]));
    assert_eq!(empty.status, StatusCode::OK);
    assert_eq!(empty.json()["entries"], json!([]));
    assert_eq!(empty.json()["scope"]["state"], "draft");

    // Upload before the first message (two files and a target directory, as the composer does).
    let pdf = b"%PDF-1.7\n1 0 obj\n<<>>\nendobj\n%%EOF\n".to_vec();
    let up = d.upload_parts(
        THREAD,
        &[
            Part::File("paper.pdf", pdf.clone()),
            Part::Text("dir", "data"),
            Part::File("table.csv", b"a,b\n1,2\n".to_vec()),
        ],
        "",
    );
    assert_eq!(up.status, StatusCode::CREATED, "{}", up.text());
    let files = up.json()["files"].clone();
    assert_eq!(files[0]["virtual_path"], "/paper.pdf", "the chat message cites the virtual path");
    assert_eq!(files[1]["virtual_path"], "/data/table.csv");
    assert_eq!(by_thread(&d)["state"], "draft", "an upload alone does not activate the scope");

    // The first message: the run reservation activates the draft.
    let reserve = |run: &str| {
        d.send(d.client.post(d.url(&format!("/internal/workspace-scopes/{scope}/runs/reserve"))).json(&json!({
            "run_request_id": run,
            "turn_id": "turn-1",
            "request_hash": "sha256:first-message",
        })))
    };
    let r = reserve("run-req-1");
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(r.json()["scope_state"], "active");
    assert_eq!(reserve("run-req-1").status, StatusCode::OK, "a retried reservation is the same one");
    let rec = by_thread(&d);
    assert_eq!(rec["state"], "active");

    // Files panel: listed, previewed (range), edited, downloaded.
    let rows = d.listing(THREAD);
    assert_eq!(
        rows,
        vec![
            ("data".to_string(), "directory".to_string(), 0),
            ("data/table.csv".to_string(), "file".to_string(), 8),
            ("paper.pdf".to_string(), "file".to_string(), pdf.len() as u64),
        ]
    );
    let preview = d.send(
        d.client
            .get(d.url("/api/workspace/file"))
            .query(&[("threadId", THREAD), ("path", "paper.pdf")])
            .header("range", "bytes=0-7"),
    );
    assert_eq!((preview.status, preview.body.as_slice()), (StatusCode::PARTIAL_CONTENT, &b"%PDF-1.7"[..]));
    assert_eq!(preview.header("content-range"), format!("bytes 0-7/{}", pdf.len()));
    assert_eq!(d.put(THREAD, "data/table.csv", b"a,b\n1,2\n3,4\n".to_vec()).status, StatusCode::OK);
    assert_eq!(d.read(THREAD, "data/table.csv").body, b"a,b\n1,2\n3,4\n");
    assert_eq!(d.put(THREAD, "notes/summary.md", b"# Summary\n".to_vec()).status, StatusCode::OK);
    let zip = d.zip_entries(THREAD);
    let names: Vec<&str> = zip.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec!["data/", "data/table.csv", "notes/", "notes/summary.md", "paper.pdf"]);
    assert_eq!(zip[1].1, b"a,b\n1,2\n3,4\n");
    assert_eq!(zip[4].1, pdf);
    let usage = d.usage(THREAD);
    assert_eq!(usage["files"].as_u64(), Some(3));

    // The run finishes; the user deletes the conversation.
    for state in ["started", "completed"] {
        let a = d.send(
            d.client
                .patch(d.url(&format!("/internal/workspace-scopes/{scope}/runs/run-req-1")))
                .json(&json!({"state": state})),
        );
        assert_eq!(a.status, StatusCode::OK, "run {state}: {}", a.text());
    }
    let revision = by_thread(&d)["revision"].as_u64().unwrap();
    let del = d.send(
        d.client
            .patch(d.url(&format!("/internal/workspace-scopes/{scope}")))
            .json(&json!({"expected_revision": revision, "state": "deleting"})),
    );
    assert!(del.status.is_success(), "{} {}", del.status, del.text());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = by_thread(&d)["state"].as_str().unwrap().to_string();
        if state == "deleted" {
            break;
        }
        assert_eq!(state, "deleting");
        assert!(Instant::now() < deadline, "the scope did not finish deleting: {}", by_thread(&d));
        std::thread::sleep(Duration::from_millis(200));
    }

    // Gone: every file route answers the uniform 404, and writes do not resurrect anything.
    for a in [
        d.read(THREAD, "paper.pdf"),
        d.send(d.client.get(d.url("/api/workspace")).query(&[("threadId", THREAD)])),
        d.send(d.client.get(d.url("/api/workspace/download")).query(&[("threadId", THREAD)])),
        d.send(d.client.get(d.url("/api/workspace/usage")).query(&[("threadId", THREAD)])),
        d.put(THREAD, "new.txt", b"x".to_vec()),
        d.upload(THREAD, "late.txt", b"x".to_vec(), ""),
    ] {
        assert_eq!((a.status, a.code().as_str()), (StatusCode::NOT_FOUND, "not_found"), "{}", a.text());
    }
}
