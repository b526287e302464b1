//! `auth_context.object_scope` (seed 003 §2.2, §4.7): the paths a signed request may read and
//! write, and the checks the tools make against it (403 `object_scope_denied` beyond it).
//!
//! Shape (seed 003 §4.4's vector): `{"read": [entry, …], "write_prefixes": [entry, …]}`.
//! - An entry is an **object-key prefix** of seed 003 §2.1's storage layout, mapped onto the
//!   paths scopefs serves them at (a file's id in that layout is its path in its scope):
//!   - `threads/{thread_id}/files/{path}`: the request's own thread → `/workspace/{path}`, another
//!     thread → `/threads/{thread_id}/{path}` (`threads/{thread_id}` alone: that whole scope);
//!   - `users/{user_id}/files/{path}` of the request's user → `/__global__/{path}`;
//!   - `jobs/{…}/artifacts/{…}` as a write prefix: the request may produce its job's artifacts,
//!     which scopefs keeps as an environment's output files in `/workspace` (see
//!     [`permit_command`], [`check_outputs`]); it lets no file tool write anything;
//!   - any other key (`objects/…`, `tmp/…`, `projects/…`, another user's) names nothing scopefs
//!     holds and grants nothing.
//! - An absolute entry is a path as the file tools take it: `/workspace/…`, `/__global__/…`,
//!   `/threads/{thread_id}/…`.
//! - Entries are prefixes **by components**: an entry covers itself and everything below it
//!   (`/workspace/out` covers `/workspace/out/a.csv`, not `/workspace/output.txt`); a trailing `/`
//!   changes nothing; `/workspace` covers the whole workspace. Exact paths in `read` are the
//!   one-file case of the same rule.
//! - A write prefix grants reading too (what a request may write it may read back).
//! - Fails closed: an entry that is no such key or path (another absolute path, `..`, a control
//!   character) grants nothing, and keys other than `read` and `write_prefixes` grant nothing.
//!   `read` or `write_prefixes` that is not a list of strings, or an `object_scope` that is not an
//!   object, is 400 `invalid_auth_context`.
//! - Without `object_scope` a request is bounded by its thread alone (the seed's gateway adds it
//!   only when it has one: `if object_scope:`).
//!
//! File tools: reading a path no entry covers, or writing one no write prefix covers, is 403.
//! list_dir, grep_files and glob_files may start at a covered directory or one on the way to a
//! covered entry; they show only entries that are covered or lie on the way to one, and grep reads
//! only covered files. Commands cannot be checked path by path: see [`permit_command`]. An
//! environment's outputs are listed and hashed, so each output path must be readable, at create
//! and at destroy ([`check_outputs`]).

use axum::http::StatusCode;
use serde_json::Value;

use scopefs::ids::ThreadId;
use scopefs::vpath;

use super::super::ApiError;

/// The namespaces an entry may name, besides `/threads/{thread_id}`.
const NAMESPACES: [&str; 2] = ["/workspace", "/__global__"];

/// A parsed `object_scope`: normalized entries (`/workspace/a/b`, `/__global__`, …).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectScope {
    read: Vec<String>,
    write: Vec<String>,
    /// A write prefix under `jobs/{…}/artifacts/`: the request may produce its job's artifacts.
    artifacts: bool,
}

/// Who signed the request: object keys of their own thread and user map onto their own paths.
#[derive(Debug, Clone, Copy)]
pub struct Signer<'a> {
    pub user_id: &'a str,
    pub thread_id: &'a str,
}

fn invalid(message: &'static str) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_auth_context", message)
}

/// A list of strings under `key` (absent: empty).
fn strings<'a>(obj: &'a serde_json::Map<String, Value>, key: &str) -> Result<Vec<&'a str>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => {
            items.iter().map(|v| v.as_str().ok_or_else(|| invalid("object_scope lists must hold strings"))).collect()
        }
        Some(_) => Err(invalid("object_scope.read and object_scope.write_prefixes must be lists")),
    }
}

/// One entry as a normalized path, or `None` when it names nothing the tools can reach.
fn entry(raw: &str, who: Signer) -> Option<String> {
    if !raw.starts_with('/') {
        return object_key(raw, who);
    }
    let raw = raw.trim_end_matches('/');
    for ns in NAMESPACES {
        if raw == ns {
            return Some(ns.to_string());
        }
        if let Some(rest) = raw.strip_prefix(ns).and_then(|r| r.strip_prefix('/')) {
            return vpath::normalize(rest).ok().map(|r| format!("{ns}/{r}"));
        }
    }
    if let Some(rest) = raw.strip_prefix("/threads/") {
        let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
        let id = ThreadId::parse(id).ok()?;
        let root = format!("/threads/{}", id.as_str());
        return if tail.is_empty() { Some(root) } else { vpath::normalize(tail).ok().map(|t| format!("{root}/{t}")) };
    }
    None
}

/// The path an object-key prefix of seed 003's layout names (module docs), if any.
fn object_key(raw: &str, who: Signer) -> Option<String> {
    let key = raw.trim_end_matches('/');
    let (root, rest) = if let Some(r) = key.strip_prefix("threads/") {
        let (id, tail) = r.split_once('/').unwrap_or((r, ""));
        let id = ThreadId::parse(id).ok()?;
        let root =
            if id.as_str() == who.thread_id { "/workspace".to_string() } else { format!("/threads/{}", id.as_str()) };
        (root, files_below(tail)?)
    } else if let Some(r) = key.strip_prefix("users/") {
        let (user, tail) = r.split_once('/').unwrap_or((r, ""));
        if user != who.user_id {
            return None;
        }
        ("/__global__".to_string(), files_below(tail)?)
    } else {
        return None;
    };
    if rest.is_empty() {
        return Some(root);
    }
    vpath::normalize(rest).ok().map(|r| format!("{root}/{r}"))
}

/// The file path below a namespace's `files/` (`""`: every file; `None`: not its files).
fn files_below(tail: &str) -> Option<&str> {
    match tail {
        "" | "files" => Some(""),
        t => t.strip_prefix("files/"),
    }
}

/// Whether `raw` is an artifact prefix of seed 003's layout: `jobs/{…}/artifacts[/…]`.
fn artifact_prefix(raw: &str) -> bool {
    let parts: Vec<&str> = raw.trim_end_matches('/').split('/').collect();
    let clean = parts.iter().all(|p| !p.is_empty() && *p != "." && *p != ".." && !p.chars().any(char::is_control));
    clean && parts.first() == Some(&"jobs") && parts.iter().skip(2).any(|p| *p == "artifacts")
}

/// Whether `entry` covers `path` (itself or below it, by components).
fn covers(entry: &str, path: &str) -> bool {
    path == entry || path.strip_prefix(entry).is_some_and(|rest| rest.starts_with('/'))
}

impl ObjectScope {
    /// Parses `auth_context.object_scope` of a request `who` signed (see the module docs).
    pub fn parse(v: &Value, who: Signer) -> Result<ObjectScope, ApiError> {
        let obj = v.as_object().ok_or_else(|| invalid("object_scope must be an object"))?;
        let read = strings(obj, "read")?.into_iter().filter_map(|e| entry(e, who)).collect();
        let writes = strings(obj, "write_prefixes")?;
        let artifacts = writes.iter().any(|e| artifact_prefix(e));
        let write = writes.into_iter().filter_map(|e| entry(e, who)).collect();
        Ok(ObjectScope { read, write, artifacts })
    }

    fn all(&self) -> impl Iterator<Item = &String> {
        self.read.iter().chain(&self.write)
    }

    /// Whether `path` (`/workspace/…`) may be read.
    pub fn may_read(&self, path: &str) -> bool {
        self.all().any(|e| covers(e, path))
    }

    /// Whether `path` may be written (created, replaced, edited).
    pub fn may_write(&self, path: &str) -> bool {
        self.write.iter().any(|e| covers(e, path))
    }

    /// Whether `path` may be shown in a listing: readable, or a directory on the way to an entry.
    pub fn may_see(&self, path: &str) -> bool {
        self.all().any(|e| covers(e, path) || covers(path, e))
    }
}

/// Reading `path` under `grant` (none: allowed), else 403.
pub fn check_read(grant: Option<&ObjectScope>, path: &str) -> Result<(), ApiError> {
    match grant {
        Some(g) if !g.may_read(path) => Err(ApiError::object_scope_denied("reading this path")),
        _ => Ok(()),
    }
}

/// Writing `path` under `grant` (none: allowed), else 403.
pub fn check_write(grant: Option<&ObjectScope>, path: &str) -> Result<(), ApiError> {
    match grant {
        Some(g) if !g.may_write(path) => Err(ApiError::object_scope_denied("writing this path")),
        _ => Ok(()),
    }
}

/// Listing or walking directory `path` under `grant` (none: allowed), else 403.
pub fn check_list(grant: Option<&ObjectScope>, path: &str) -> Result<(), ApiError> {
    match grant {
        Some(g) if !g.may_see(path) => Err(ApiError::object_scope_denied("listing this directory")),
        _ => Ok(()),
    }
}

/// Collecting an environment's outputs reads (lists and hashes) every file below each output path
/// (`/workspace/...` or relative, and `/__global__/...` when `global`: the environment has the global
/// store read-write, so its changes there are collected): under `grant` each must be readable, else
/// 403 (review N7), unless
/// the grant lets the request produce its job's artifacts (a `jobs/{…}/artifacts/` write prefix:
/// the outputs are those artifacts). A path that is not an output path at all is left to the
/// service, which refuses it with 400.
pub fn check_outputs(grant: Option<&ObjectScope>, paths: &[String], global: bool) -> Result<(), ApiError> {
    if grant.is_none_or(|g| g.artifacts) {
        return Ok(());
    }
    for raw in paths {
        let Ok(split) = crate::services::compute::output_paths(std::slice::from_ref(raw), global) else { continue };
        let global = split.global.iter().map(|p| crate::services::compute::global_artifact(p));
        for path in split.workspace.iter().map(|p| crate::services::compute::workspace_path(p)).chain(global) {
            check_read(grant, &path)?;
        }
    }
    Ok(())
}

/// Whether a request under `grant` may run a command (execute_command, start_process) in an
/// environment whose `/workspace` is mounted read-only (`read_only`) or writable. A command can
/// read, and in a writable environment change, anything below `/workspace`, which no path check
/// can follow; so a writable environment needs a write prefix covering `/workspace` and a
/// read-only one needs `/workspace` readable. A `jobs/{…}/artifacts/` write prefix (seed 003's
/// golden vector) grants running the job: its artifacts are the files it writes in `/workspace`
/// (the seed's container writes its `/workspace` copy freely too). Without `object_scope`:
/// allowed (the thread's rules apply). Refused: 403 `object_scope_denied`.
pub fn permit_command(grant: Option<&ObjectScope>, read_only: bool) -> Result<(), ApiError> {
    match grant {
        Some(g) if g.artifacts => Ok(()),
        Some(g) if !read_only && !g.may_write("/workspace") => {
            Err(ApiError::object_scope_denied("writing /workspace, which a command in a writable environment can"))
        }
        Some(g) if !g.may_read("/workspace") => {
            Err(ApiError::object_scope_denied("reading /workspace, which a command can"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const WHO: Signer = Signer { user_id: "u1", thread_id: "thr_me" };

    fn scope(v: Value) -> ObjectScope {
        ObjectScope::parse(&v, WHO).unwrap()
    }

    #[test]
    fn entries_are_prefixes_by_components() {
        let g = scope(json!({"read": ["/workspace/data.csv", "/workspace/in/"], "write_prefixes": ["/workspace/out"]}));
        assert!(g.may_read("/workspace/data.csv"));
        assert!(g.may_read("/workspace/in/a/b.txt"));
        assert!(g.may_read("/workspace/out/x"), "a write prefix can be read back");
        assert!(!g.may_read("/workspace/data.csv.bak"));
        assert!(!g.may_read("/workspace/output.txt"));
        assert!(!g.may_read("/workspace"));
        assert!(g.may_write("/workspace/out/x") && g.may_write("/workspace/out"));
        assert!(!g.may_write("/workspace/in/a") && !g.may_write("/workspace/data.csv"));
        assert!(g.may_see("/workspace") && g.may_see("/workspace/in/a"));
        assert!(!g.may_see("/workspace/other"));
    }

    #[test]
    fn unreachable_entries_grant_nothing_and_shapes_are_checked() {
        let g = scope(json!({"read": ["/etc/passwd", "../x", "a/../../b", "", "/", "a\u{1}", "data.csv"], "other": 1}));
        assert_eq!(g, ObjectScope::default());
        assert!(!g.may_see("/workspace"));
        let threads = scope(json!({"read": ["/threads/thr_1/", "/__global__"]}));
        assert!(threads.may_read("/threads/thr_1/a") && threads.may_read("/__global__/x"));
        assert!(!threads.may_read("/threads/thr_10/a") && !threads.may_read("/workspace/a"));
        for bad in [json!([]), json!({"read": "x"}), json!({"write_prefixes": [1]})] {
            assert_eq!(ObjectScope::parse(&bad, WHO).unwrap_err().code, "invalid_auth_context", "{bad}");
        }
    }

    /// Issue 24, item 2: entries are object-key prefixes of seed 003 §2.1's layout.
    #[test]
    fn object_keys_map_onto_the_paths_scopefs_serves_them_at() {
        let g = scope(json!({
            "read": ["threads/thr_me/files/in/data.csv", "threads/thr_peer/files/notes/", "users/u1/files/lib",
                     "users/u2/files/x", "objects/in/data.csv", "tmp/j/o", "projects/p/files/a",
                     "threads/thr_me/other/a", "threads/thr_me/files/../../x"],
            "write_prefixes": ["threads/thr_me/files/out/"]}));
        assert!(g.may_read("/workspace/in/data.csv") && !g.may_read("/workspace/in/other.csv"));
        assert!(g.may_read("/threads/thr_peer/notes/a.md") && !g.may_read("/threads/thr_peer/secret"));
        assert!(g.may_read("/__global__/lib/x.py") && !g.may_read("/__global__/x"));
        assert!(g.may_write("/workspace/out/r.csv") && !g.may_write("/workspace/in/data.csv"));
        assert!(!g.artifacts);
        let whole = scope(json!({"read": ["threads/thr_peer", "users/u1/files/"]}));
        assert!(whole.may_read("/threads/thr_peer/any/thing") && whole.may_read("/__global__/a"));
        assert!(!whole.may_read("/workspace/a"));
        // The golden vector: an input object scopefs does not hold, and the job's artifacts.
        let golden = scope(json!({"read": ["objects/in/data.csv"], "write_prefixes": ["jobs/job_1/artifacts/"]}));
        assert!(golden.artifacts && !golden.may_read("/workspace/objects/in/data.csv"));
        assert!(!golden.may_write("/workspace/jobs/job_1/artifacts/a") && !golden.may_write("/workspace"));
        assert!(scope(json!({"write_prefixes": ["jobs/t/r/artifacts/"]})).artifacts);
        for not_artifacts in
            ["jobs/artifacts/", "jobs//artifacts", "jobs/j/../artifacts", "x/jobs/j/artifacts", "jobs/j"]
        {
            assert!(!scope(json!({"write_prefixes": [not_artifacts]})).artifacts, "{not_artifacts}");
        }
        assert!(!scope(json!({"read": ["jobs/job_1/artifacts/"]})).artifacts, "read entries grant no artifacts");
    }

    #[test]
    fn commands_need_the_whole_workspace() {
        let whole = scope(json!({"write_prefixes": ["/workspace/"]}));
        let reader = scope(json!({"read": ["/workspace"], "write_prefixes": ["/workspace/out"]}));
        let job = scope(json!({"read": ["objects/in/data.csv"], "write_prefixes": ["jobs/job_1/artifacts/"]}));
        assert!(permit_command(None, false).is_ok());
        assert!(permit_command(Some(&whole), false).is_ok());
        assert_eq!(permit_command(Some(&reader), false).unwrap_err().code, "object_scope_denied");
        assert!(permit_command(Some(&reader), true).is_ok());
        assert!(permit_command(Some(&ObjectScope::default()), true).is_err());
        assert!(permit_command(Some(&job), false).is_ok() && permit_command(Some(&job), true).is_ok());
        assert!(check_outputs(Some(&job), &["/workspace".to_string()], true).is_ok(), "its outputs are its artifacts");
    }

    /// Review N7: an environment's outputs are listed and hashed, so each output path must be
    /// readable under the grant, at create (its defaults) and at destroy.
    #[test]
    fn outputs_must_be_readable_under_the_grant() {
        let g = scope(json!({"read": ["/workspace/in"], "write_prefixes": ["/workspace/out/"]}));
        let paths = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_outputs(None, &paths(&["/workspace"]), true).is_ok(), "no grant: the thread's rules");
        let granted = paths(&["/workspace/in", "in/a.txt", "/workspace/out/", "out/x"]);
        assert!(check_outputs(Some(&g), &granted, true).is_ok());
        for denied in ["/workspace", "/workspace/", ".", "secret.txt", "/workspace/inside", "/__global__"] {
            let answer = check_outputs(Some(&g), &paths(&["/workspace/in", denied]), true);
            assert_eq!(answer.err().map(|e| e.code), Some("object_scope_denied"), "{denied}");
        }
        assert!(check_outputs(Some(&g), &[], true).is_ok());
        // The seed's default output paths name the global store; an environment without it
        // read-write collects nothing there, so a workspace-only grant is not asked to read it.
        let workspace = scope(json!({"write_prefixes": ["/workspace"]}));
        let defaults = paths(&["/workspace", "/__global__"]);
        assert!(check_outputs(Some(&workspace), &defaults, false).is_ok());
        let answer = check_outputs(Some(&workspace), &defaults, true);
        assert_eq!(answer.err().map(|e| e.code), Some("object_scope_denied"));
        // Not an output path at all: the service answers 400 for it (nothing is read).
        assert!(crate::services::compute::output_path("/workspace/in/../secret.txt").is_err());
    }
}
