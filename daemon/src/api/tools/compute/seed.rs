//! The request bodies of `create_environment` and `destroy_environment` exactly as seed 003 §4.5 and
//! §5 write them (`deny_unknown_fields`: a field the daemon does not know is a 400 naming it), their
//! validation, and the seed's response fields (`execution_mode`, `backend_type`, `resource_ref`,
//! the artifact manifest).
//!
//! What each field does here: `max_runtime_seconds`, `limits.max_runtime_seconds` and
//! `budget_snapshot.effective_max_runtime_seconds` cap the runtime (the smallest wins, then the
//! daemon's own preflight); `limits.max_stdout_stderr_bytes` caps every command's output;
//! `default_output_paths` are collected as artifacts at destroy; `image_ref` must be the configured
//! image (else 403). `resource_class`, `backend_policy`, `execution_mode`,
//! `shared_compute_eligible`, the other `limits`, `input_objects` (validated: mount paths, no
//! duplicates, no writable `/threads/*`; recorded as a count, bytes and the views they grant),
//! `artifact_prefix` and `budget_snapshot` are validated and recorded with the environment.
//! `limits.max_user_concurrency` bounds the user's live shared environments (seed §15.2). `execution_mode`, `shared_compute_eligible`, `resource_class`,
//! `backend_policy`, the input sizes and the limits also decide shared compute
//! (`services::compute::shared`: eligible requests answer "simple"/"shared", others "standard").
//! An `input_objects` entry mounted at or below `/threads/{thread_id}` or `/__global__` is the
//! explicit grant of a view of that thread's scope (same user only, else 404; read-only) or of the
//! user's global store (read-write when an entry says `read_only: false`), bound into the
//! container (`services::peers`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::services::compute::shared::SharedRequest;
use crate::services::compute::ComputeError;
use crate::services::compute::{CreateEnvironment, DestroyEnvironment, EnvironmentOptions, WORKSPACE};
use crate::services::peers::{View, ViewGrant, GLOBAL_ROOT, THREADS_ROOT};

/// Longest `resource_class`, `backend_policy` or `artifact_prefix`.
const MAX_LABEL: usize = 256;

/// `execution_mode` of seed 003 §4.5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionMode {
    Simple,
    Shared,
    Standard,
    Isolated,
}

/// `limits` of seed 003 §5.
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Seed 003 §15.2: live shared environments of the user (at most
    /// `limits.max_shared_environments_per_user` whatever it says).
    pub max_user_concurrency: Option<u64>,
    pub max_input_bytes: Option<u64>,
    pub max_output_bytes: Option<u64>,
    pub max_stdout_stderr_bytes: Option<u64>,
    pub max_files: Option<u64>,
    pub max_runtime_seconds: Option<u64>,
}

/// One `InputObject` (seed 003 §3.1).
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputObject {
    pub file_id: String,
    pub object_key: String,
    pub sha256: String,
    pub size_bytes: u64,
    pub mount_path: String,
    pub read_only: bool,
}

/// The body of `create_environment`.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateParams {
    pub max_runtime_seconds: Option<u64>,
    pub resource_class: Option<String>,
    pub backend_policy: Option<String>,
    pub execution_mode: Option<ExecutionMode>,
    pub shared_compute_eligible: Option<bool>,
    pub image_ref: Option<String>,
    pub limits: Option<Limits>,
    pub input_objects: Option<Vec<InputObject>>,
    pub artifact_prefix: Option<String>,
    pub default_output_paths: Option<Vec<String>>,
    pub budget_snapshot: Option<Map<String, Value>>,
}

/// The body of `destroy_environment`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DestroyParams {
    pub environment_id: String,
    pub persist_outputs: Option<bool>,
    pub output_paths: Option<Vec<String>>,
    #[serde(default)]
    pub force_destroy: bool,
    pub artifact_prefix: Option<String>,
}

fn invalid(field: &'static str, text: impl Into<String>) -> ComputeError {
    ComputeError::Invalid(field, text.into())
}

fn check_label(field: &'static str, v: &Option<String>) -> Result<(), ComputeError> {
    match v {
        Some(s) if s.is_empty() || s.len() > MAX_LABEL || s.chars().any(char::is_control) => {
            Err(invalid(field, format!("must be 1-{MAX_LABEL} characters without control characters")))
        }
        _ => Ok(()),
    }
}

/// Seed 003 §3.7 steps: mount paths under `/workspace`, `/__global__` or `/threads/{id}`, no
/// `..`, no duplicates, nothing writable under `/threads/*`.
fn check_inputs(inputs: &[InputObject]) -> Result<(), ComputeError> {
    let mut seen = std::collections::HashSet::new();
    for o in inputs {
        let p = o.mount_path.as_str();
        let rooted = p == GLOBAL_ROOT
            || [WORKSPACE, GLOBAL_ROOT, THREADS_ROOT]
                .iter()
                .any(|r| p.strip_prefix(r).is_some_and(|t| t.starts_with('/')));
        if !rooted || p.split('/').any(|c| c == ".." || c == ".") || p.chars().any(char::is_control) {
            return Err(invalid(
                "input_objects",
                format!("mount_path {p:?} must be below /workspace, /__global__ or /threads/{{id}}"),
            ));
        }
        if p.starts_with("/threads/") && !o.read_only {
            return Err(invalid("input_objects", format!("mount_path {p:?} under /threads must be read_only")));
        }
        if !seen.insert(p.trim_end_matches('/')) {
            return Err(invalid("input_objects", format!("mount_path {p:?} appears twice")));
        }
        if o.sha256.len() != 64 || !o.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid("input_objects", "sha256 must be 64 hex digits"));
        }
    }
    Ok(())
}

/// The views `input_objects` grant (services::peers): every entry mounted at or below
/// `/threads/{thread_id}` or `/__global__` grants that view, once; `/__global__` is writable when
/// any of its entries is `read_only: false` (seed 003 §3.7 step 3b writes them so).
fn views_of(inputs: &[InputObject]) -> Result<Vec<ViewGrant>, ComputeError> {
    let mut views: Vec<ViewGrant> = Vec::new();
    for o in inputs {
        let view = match View::split(&o.mount_path) {
            None => continue,
            Some(Err(_)) => {
                return Err(invalid("input_objects", format!("mount_path {:?} names no valid thread", o.mount_path)))
            }
            Some(Ok((view, _))) => view,
        };
        let writable = view == View::Global && !o.read_only;
        match views.iter_mut().find(|g| g.view == view) {
            Some(g) => g.writable |= writable,
            None => views.push(ViewGrant { view, writable }),
        }
    }
    Ok(views)
}

/// What is recorded of `input_objects`: how many and their bytes, and the views they grant (a
/// seed manifest lists every file of the conversation, which the scope holds already).
fn inputs_summary(inputs: &[InputObject], views: &[ViewGrant]) -> Value {
    let bytes = inputs.iter().fold(0u64, |n, o| n.saturating_add(o.size_bytes));
    let views: Vec<String> = views.iter().map(|g| g.view.root()).collect();
    serde_json::json!({"count": inputs.len(), "size_bytes": bytes, "views": views})
}

/// The smallest of the runtime caps a request names.
fn runtime_cap(p: &CreateParams) -> Result<Option<u64>, ComputeError> {
    let budget = match p.budget_snapshot.as_ref().and_then(|b| b.get("effective_max_runtime_seconds")) {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            invalid("budget_snapshot", "effective_max_runtime_seconds must be a non-negative integer")
        })?),
    };
    let limit = p.limits.as_ref().and_then(|l| l.max_runtime_seconds);
    Ok([p.max_runtime_seconds, limit, budget].into_iter().flatten().min())
}

impl CreateParams {
    /// What the body says about shared compute (seed 003 §5): asked for by `execution_mode`
    /// "simple"/"shared", or by `shared_compute_eligible` when no mode is named.
    fn shared_request(&self) -> SharedRequest {
        let asked = match (self.execution_mode, self.shared_compute_eligible) {
            (Some(ExecutionMode::Simple), _) | (None, Some(true)) => Some("simple"),
            (Some(ExecutionMode::Shared), _) => Some("shared"),
            _ => None,
        };
        let inputs = self.input_objects.as_deref().unwrap_or_default();
        SharedRequest {
            asked,
            resource_class: self.resource_class.clone(),
            backend_policy: self.backend_policy.clone(),
            input_bytes: inputs.iter().fold(0u64, |n, o| n.saturating_add(o.size_bytes)),
            max_input_bytes: self.limits.as_ref().and_then(|l| l.max_input_bytes),
            max_user_concurrency: self.limits.as_ref().and_then(|l| l.max_user_concurrency),
        }
    }

    /// Validates the body and turns it into the service's request.
    pub fn into_request(self) -> Result<CreateEnvironment, ComputeError> {
        check_label("resource_class", &self.resource_class)?;
        check_label("backend_policy", &self.backend_policy)?;
        check_label("artifact_prefix", &self.artifact_prefix)?;
        check_inputs(self.input_objects.as_deref().unwrap_or_default())?;
        let views = views_of(self.input_objects.as_deref().unwrap_or_default())?;
        let max_runtime_seconds = runtime_cap(&self)?;
        let shared = self.shared_request();
        let recorded = serde_json::json!({
            "resource_class": self.resource_class,
            "backend_policy": self.backend_policy,
            "execution_mode": self.execution_mode,
            "shared_compute_eligible": self.shared_compute_eligible,
            "limits": self.limits,
            "input_objects": inputs_summary(self.input_objects.as_deref().unwrap_or_default(), &views),
            "artifact_prefix": self.artifact_prefix,
            "budget_snapshot": self.budget_snapshot,
        });
        let options = EnvironmentOptions {
            default_output_paths: self.default_output_paths.unwrap_or_default(),
            max_output_bytes: self.limits.as_ref().and_then(|l| l.max_stdout_stderr_bytes),
            max_artifact_files: self.limits.as_ref().and_then(|l| l.max_files),
            max_artifact_bytes: self.limits.as_ref().and_then(|l| l.max_output_bytes),
            recorded,
            execution_mode: None,
            // Set by the service when it creates the environment.
            outputs_since_ns: None,
            global_store_scope: None,
        };
        Ok(CreateEnvironment {
            max_runtime_seconds,
            image_ref: self.image_ref,
            input_objects: self.input_objects.map_or(0, |v| v.len()),
            shared,
            views,
            options,
        })
    }
}

impl DestroyParams {
    /// Validates the body and turns it into the service's request (`artifact_prefix` is validated:
    /// artifacts stay in the scope, nothing is copied under a prefix).
    pub fn to_request(&self) -> Result<DestroyEnvironment, ComputeError> {
        check_label("artifact_prefix", &self.artifact_prefix)?;
        Ok(DestroyEnvironment {
            persist_outputs: self.persist_outputs,
            output_paths: self.output_paths.clone(),
            force_destroy: self.force_destroy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 003 §5's example body is accepted as written; an unknown field is refused by name.
    #[test]
    fn the_seed_example_parses_and_unknown_fields_are_named() {
        let body = serde_json::json!({
            "execution_mode": "simple", "shared_compute_eligible": true, "resource_class": "shared-small",
            "backend_policy": "auto",
            "input_objects": [{"file_id": "file_123", "object_key": "threads/thr_1/files/file_123",
                "sha256": "a".repeat(64), "size_bytes": 1024, "mount_path": "/workspace/data.csv", "read_only": false}],
            "artifact_prefix": "jobs/t/r/artifacts/", "default_output_paths": ["/workspace"],
            "max_runtime_seconds": 60,
            "budget_snapshot": {"plan": "pro", "effective_max_runtime_seconds": 45, "cash_balance_snapshot": "10.000000"},
            "limits": {"max_input_bytes": 10485760, "max_output_bytes": 10485760,
                "max_stdout_stderr_bytes": 1048576, "max_files": 100},
            "image_ref": "img"
        });
        let req = serde_json::from_value::<CreateParams>(body).unwrap().into_request().unwrap();
        assert_eq!(req.max_runtime_seconds, Some(45), "the budget snapshot's cap is the smallest");
        assert_eq!(req.options.max_output_bytes, Some(1048576));
        assert_eq!(req.options.default_output_paths, vec!["/workspace".to_string()]);
        let err = serde_json::from_value::<CreateParams>(serde_json::json!({"gpu": 1})).unwrap_err();
        assert!(err.to_string().contains("gpu"), "{err}");
        let err = serde_json::from_value::<Limits>(serde_json::json!({"max_gpus": 1})).unwrap_err();
        assert!(err.to_string().contains("max_gpus"), "{err}");
    }

    #[test]
    fn input_objects_follow_the_mount_rules() {
        let obj = |p: &str, ro: bool| InputObject {
            file_id: "f".into(),
            object_key: "k".into(),
            sha256: "0".repeat(64),
            size_bytes: 1,
            mount_path: p.into(),
            read_only: ro,
        };
        assert!(check_inputs(&[obj("/workspace/a", false), obj("/threads/t1/x", true)]).is_ok());
        assert!(check_inputs(&[obj("/threads/t1", true), obj("/__global__", true)]).is_ok(), "whole views");
        let inputs = [obj("/threads/t1/x", true), obj("/threads/t1", true), obj("/__global__/g", true)];
        let t1 = ViewGrant { view: View::Thread(scopefs::ids::ThreadId::parse("t1").unwrap()), writable: false };
        let global = |writable| ViewGrant { view: View::Global, writable };
        assert_eq!(views_of(&inputs).unwrap(), vec![t1.clone(), global(false)], "one view per thread, in order");
        let rw = [obj("/__global__/a", true), obj("/threads/t1/x", true), obj("/__global__/b", false)];
        assert_eq!(views_of(&rw).unwrap(), vec![global(true), t1], "an entry read_only: false makes it writable");
        assert!(views_of(&[obj("/workspace/a", false)]).unwrap().is_empty());
        assert!(views_of(&[obj("/threads/__global__.u/x", true)]).is_err(), "reserved thread ids");
        for bad in [
            vec![obj("/etc/x", true)],
            vec![obj("/workspace/../x", true)],
            vec![obj("/threads/t/x", false)],
            vec![obj("/workspace/a", true), obj("/workspace/a", true)],
        ] {
            assert!(matches!(check_inputs(&bad), Err(ComputeError::Invalid("input_objects", _))));
        }
    }
}
