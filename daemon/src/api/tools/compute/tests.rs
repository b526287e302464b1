//! Unit tests of `api::tools::compute`.
use super::*;
use scopefs::registry::environments::ProcessState;
use serde_json::json;

fn env(user: &str, thread: &str, read_only: bool) -> EnvironmentRecord {
    EnvironmentRecord {
        environment_id: "env_1".into(),
        scope_id: ScopeId::generate(),
        owner_id: format!("owner-of-{thread}"),
        user_id: user.into(),
        thread_id: thread.into(),
        container_id: None,
        read_only,
        state: EnvironmentState::Running,
        revision: 1,
        requested_max_runtime_seconds: None,
        effective_max_runtime_seconds: 60,
        created_at: 0,
        started_at: Some(0),
        ended_at: None,
        runtime_seconds: None,
        end_reason: None,
    }
}

fn who(user: &str, thread: &str, may_write: bool) -> Who {
    Who { user_id: user.into(), thread_id: thread.into(), may_write }
}

fn code(r: Result<(), ApiError>) -> Option<(u16, &'static str)> {
    r.err().map(|e| (e.status.as_u16(), e.code))
}

/// Review M4: a memory worker (may not write) runs only in read-only environments it created;
/// ending an environment or its processes is for the creating thread only.
#[test]
fn read_only_callers_use_only_their_read_only_environments() {
    let primary = who("u1", "thr-a", true);
    let worker = who("u1", "mw-1", false);
    let primary_rw = env("u1", "thr-a", false);
    let worker_ro = env("u1", "mw-1", true);
    let worker_rw = env("u1", "mw-1", false);
    assert_eq!(code(permit(&worker, &primary_rw, Use::Run)), Some((403, "read_only")));
    assert_eq!(code(permit(&worker, &worker_rw, Use::Run)), Some((403, "read_only")));
    assert_eq!(code(permit(&worker, &env("u1", "thr-a", true), Use::Run)), Some((403, "read_only")));
    assert_eq!(code(permit(&worker, &worker_ro, Use::Run)), None);
    assert_eq!(code(permit(&primary, &primary_rw, Use::Run)), None);
    assert_eq!(code(permit(&primary, &worker_ro, Use::Run)), None, "a writer may run anywhere in its scope");

    assert_eq!(code(permit(&worker, &primary_rw, Use::End)), Some((403, "not_owner")));
    assert_eq!(code(permit(&primary, &worker_ro, Use::End)), Some((403, "not_owner")));
    assert_eq!(code(permit(&who("u2", "thr-a", true), &primary_rw, Use::End)), Some((403, "not_owner")));
    assert_eq!(code(permit(&worker, &worker_ro, Use::End)), None);
    assert_eq!(code(permit(&primary, &primary_rw, Use::End)), None);
}

/// Review L12: another user's environment is listed without its identities.
#[test]
fn other_users_identities_are_not_listed() {
    let view =
        |e: EnvironmentRecord, w: Who| serde_json::to_value(EnvView::seen_by(e, &w, Execution::standard())).unwrap();
    let mine = view(env("u1", "thr-a", false), who("u1", "thr-b", true));
    assert_eq!((mine["user_id"].as_str(), mine["thread_id"].as_str()), (Some("u1"), Some("thr-a")));
    let theirs = view(env("u2", "thr-x", false), who("u1", "thr-a", true));
    for k in ["user_id", "thread_id", "owner_id"] {
        assert!(theirs.get(k).is_none(), "{k} leaked: {theirs}");
    }
    assert_eq!((theirs["environment_id"].as_str(), theirs["status"].as_str()), (Some("env_1"), Some("running")));
}

/// The typed answers are the JSON the former `json!` bodies built (compared as JSON values).
#[test]
fn typed_answers_serialize_as_the_former_json_bodies() {
    let record = env("u1", "thr-a", false);
    // Former `env_json`: the record's serialization plus `status`.
    let mut former = serde_json::to_value(&record).unwrap();
    former["status"] = json!(record.state.as_str());
    // Plus the seed's response fields (003 §5).
    former["execution_mode"] = json!("standard");
    former["backend_type"] = json!("docker");
    former["resource_ref"] = json!("docker/dedicated/env_1");
    assert_eq!(serde_json::to_value(EnvView::of(record.clone(), true, Execution::standard())).unwrap(), former);
    // Former destroy_environment of another user's environment: identities removed, two keys added.
    let mut theirs = former.clone();
    for k in ["user_id", "thread_id", "owner_id"] {
        theirs.as_object_mut().unwrap().remove(k);
    }
    theirs["already_ended"] = json!(true);
    theirs["artifacts"] = json!([]);
    theirs["artifacts_lost"] = json!(false);
    let env = EnvView::seen_by(record.clone(), &who("u2", "thr-b", true), Execution::standard());
    let destroyed = DestroyedView {
        env,
        already_ended: true,
        artifacts: Vec::new(),
        artifacts_lost: false,
        outputs_not_recorded: Vec::new(),
    };
    assert_eq!(serde_json::to_value(destroyed).unwrap(), theirs);
    // A shared-pool environment answers the seed's shared fields (003 §5), no container named.
    let shared = serde_json::to_value(EnvView::of(record, true, Execution::shared("simple"))).unwrap();
    assert_eq!(
        (&shared["execution_mode"], &shared["backend_type"], &shared["resource_ref"]),
        (&json!("simple"), &json!("shared_compute"), &json!("shared-worker-pool/default"))
    );

    let out = ExecOutput {
        stdout: b"out\xff".to_vec(),
        stderr: b"err".to_vec(),
        exit_code: Some(3),
        truncated: true,
        timed_out: false,
    };
    let former = json!({
        "environment_id": "env_1",
        "stdout": String::from_utf8_lossy(&out.stdout),
        "stderr": String::from_utf8_lossy(&out.stderr),
        "exit_code": out.exit_code,
        "truncated": out.truncated,
        "timed_out": out.timed_out,
    });
    assert_eq!(serde_json::to_value(ExecView::of("env_1".into(), out)).unwrap(), former);

    let process = ProcessRecord {
        process_id: "proc_1".into(),
        scope_id: ScopeId::generate(),
        environment_id: "env_1".into(),
        owner_id: "owner".into(),
        command: "sleep 1".into(),
        exec_id: Some("exec".into()),
        state: ProcessState::Running,
        revision: 2,
        exit_code: None,
        created_at: 1,
        started_at: Some(2),
        ended_at: None,
        end_reason: None,
    };
    // Former check_process: the record's serialization plus the log keys.
    let mut former = serde_json::to_value(&process).unwrap();
    former["log_tail"] = json!("tail");
    former["log_bytes"] = json!(4);
    former["log_truncated"] = json!(false);
    let checked = CheckedView { process, log_tail: "tail".into(), log_bytes: 4, log_truncated: false };
    assert_eq!(serde_json::to_value(checked).unwrap(), former);
}
