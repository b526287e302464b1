//! `/tools/*` file tools (seed 003 §4.5–4.7): read, write, edit, list, grep, glob, upload and
//! download, on the scope's file engine (no container needed).
//!
//! Conventions:
//! - Every route takes a [`SignedRequest`]; its parameters are the seed's (§4.5) and nothing else:
//!   an unknown field is 400 `invalid_request` naming it. `environment_id` may be sent: it must
//!   name a live environment (creating or running) of the request's scope, else 404
//!   `environment_not_found` (an unknown id, another scope's, or one that has ended); the files of
//!   every environment of a scope are the scope's files.
//! - Paths are `/workspace/...` or relative to `/workspace`; read, write, edit, list, upload and
//!   download, grep and glob also take `/threads/{thread_id}/...` (read-only) and `/__global__/...`
//!   views of the same user's scopes ([`super::target`]). Anything else
//!   (another absolute path, `..`, control characters, reserved names) is 400 `invalid_path`.
//!   Answers name files as the request did (`/workspace/...`, ...), which every route takes back.
//! - `auth_context.object_scope`, when signed, bounds every route (rules in [`super::object_scope`]):
//!   reading a path it does not cover, or writing one no write prefix covers, is 403
//!   `object_scope_denied`; listings, grep and glob show only what it lets the caller see.
//! - Symlinks are never followed: the engine's path API resolves without following them, and
//!   `grep_files`/`glob_files` walk directories with `list_path`, descending only into real
//!   directories, so nothing outside the scope is ever reached whatever the pattern.
//! - Content moved in one request is at most `ToolsAuth::file_limit` bytes (more is 413); read_file
//!   and edit_file need UTF-8 text (otherwise 409 `not_utf8`: use download_file); a full quota is 507.
//! - `edit_file`: `old_string` must occur exactly once unless `replace_all`; absent → 409
//!   `old_string_not_found`, several → 409 `old_string_not_unique` (a conflict with the file's
//!   current content, not a malformed request). The edit is an atomic replace of the whole file,
//!   and only of the version it read: a write in between answers 409 `file_changed` (nothing lost).
//!   The size of the result (`len + count × (len(new) − len(old))`) is computed with checked
//!   arithmetic before anything is built; over the file limit is 413 (`edit_result`). The answer's
//!   `diff` is a unified diff of the change (seed 003 §6 `EditResult(diff)`), at most
//!   `[limits] edit_max_diff_bytes`: a longer one is cut there and `diff_truncated` is true.
//! - `grep_files`: `pattern` is a regular expression (Rust `regex` syntax: no backreferences or
//!   look-around, so matching is linear in the data; `^`/`$` match at line ends) of at most
//!   `[limits] grep_max_pattern_bytes` (more is 413) that compiles to at most `grep_max_regex_bytes`
//!   (more is 413, before any file is read); an invalid one is 400 `invalid_pattern` naming the
//!   problem. Optional `glob` filters file paths (relative to `path`); at most 200 matches, files
//!   over the file limit are skipped, lines are cut at 1000 bytes.
//! - `glob_files` answers `matches`: `*` and `?` within a name, `**` across directories, `[abc]`
//!   classes; patterns of at most `glob_max_pattern_bytes` (more is 413), matched as a set of states
//!   (linear in the path whatever the number of `**`; directories no match can lie below are not
//!   walked); at most 1000 results. Patterns with `..`, or absolute outside `/workspace`, are 400.
//! - Walks stop after `max_walk_entries` entries or `http_request_timeout_secs` and say `truncated`.
//! - Writes (write_file, edit_file, upload_file) are refused with 403 `read_only` for a memory
//!   worker's thread (SPEC §8).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Json;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use scopefs::engine::{Attr, EngineError, FileKind, ScopeEngine, WriteMode};
use scopefs::limits::{self, Bound};
use scopefs::vpath::{self, PathError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::time::UNIX_EPOCH;

use super::super::error::ErrorCode as E;
use super::super::held_answer::HeldAnswer;
use super::super::routes::{Auth, Doc, RouteTable};
use super::super::{blocking_as, file_kind_name, ApiError, AppState};
use super::auth::SignedRequest;
use super::body_memory::json_string_len;
use super::edit::{edited_len, replace_bounded, unified_diff};
use super::engine_err;
use super::object_scope::check_list;
use super::search::{self, Glob, Visit, WalkBudget};
use super::target::target;
use crate::pools::RouteClass::Tools;
use crate::services::compute::ComputeError;
use crate::services::files::write_creating_parents;
use crate::services::ServiceError;

/// Most entries `list_dir` returns.
const MAX_LIST: usize = 1000;
/// Most matches `grep_files` returns.
const MAX_GREP_MATCHES: usize = 200;
/// Most paths `glob_files` returns.
const MAX_GLOB: usize = 1000;
/// Longest line `grep_files` returns.
const MAX_LINE: usize = 1000;
/// Most bytes of matches (paths and lines, as JSON) a `grep_files` or `glob_files` answer holds;
/// past them the answer is `truncated`. With the counts above this bounds what one search builds
/// on its worker (paths may be 16 KiB and escape to six bytes a byte); the answer is then charged
/// to the `/tools` body budget until the client has taken it.
const MAX_SEARCH_ANSWER_BYTES: u64 = 2 << 20;
/// The prefix of the container view of a scope.
const WORKSPACE: &str = "/workspace";

/// Adds the file tool routes to the table.
/// What every file tool can answer (besides the signed routes' own codes).
const FILE_ERRORS: &[E] = &[
    E::InvalidPath,
    E::FileNotFound,
    E::EnvironmentNotFound,
    E::ObjectScopeDenied,
    E::ScopeDeleting,
    E::ScopeUnavailable,
    E::ObjectStoreUnavailable,
    E::EngineError,
    E::RegistryError,
];
/// What a file tool that writes can answer besides.
const WRITE_ERRORS: &[E] = &[
    E::ReadOnly,
    E::TooLarge,
    E::IsADirectory,
    E::NotADirectory,
    E::FileExists,
    E::FileChanged,
    E::NotPermitted,
    E::QuotaExceeded,
    E::NoSpace,
];

pub fn add_routes(table: RouteTable<AppState>) -> RouteTable<AppState> {
    let s = Auth::Signed;
    table
        .add("POST", "/tools/read_file", s, "Read a text file of the workspace", post(super::reads::read_file))
        .doc(
            Doc::new()
                .signed_body::<super::reads::PathParams>()
                .ok::<super::reads::ReadView>(200)
                .errors(FILE_ERRORS)
                .errors(&[E::IsADirectory, E::NotUtf8, E::TooLarge]),
        )
        .add("POST", "/tools/write_file", s, "Write a text file (atomic replace, creates parents)", post(write_file))
        .doc(Doc::new().signed_body::<WriteParams>().ok::<WrittenView>(200).errors(FILE_ERRORS).errors(WRITE_ERRORS))
        .add("POST", "/tools/edit_file", s, "Replace a unique old_string (or all with replace_all)", post(edit_file))
        .doc(
            Doc::new()
                .signed_body::<EditParams>()
                .ok::<EditView>(200)
                .errors(FILE_ERRORS)
                .errors(WRITE_ERRORS)
                .errors(&[E::NotUtf8, E::OldStringNotFound, E::OldStringNotUnique]),
        )
        .add("POST", "/tools/list_dir", s, "List one directory (bounded)", post(list_dir))
        .doc(Doc::new().signed_body::<DirParams>().ok::<DirView>(200).errors(FILE_ERRORS).errors(&[
            E::NotADirectory,
            E::TooManyEntries,
            E::ListingTooLarge,
        ]))
        .add(
            "POST",
            "/tools/grep_files",
            s,
            "Regular-expression search (Rust regex syntax) in files below a directory (bounded)",
            post(grep_files),
        )
        .doc(Doc::new().signed_body::<GrepParams>().ok::<GrepView>(200).errors(FILE_ERRORS).errors(&[
            E::InvalidPattern,
            E::NotADirectory,
            E::TooManyEntries,
            E::ListingTooLarge,
        ]))
        .add("POST", "/tools/glob_files", s, "Paths matching a glob pattern (bounded)", post(glob_files))
        .doc(Doc::new().signed_body::<GlobParams>().ok::<GlobView>(200).errors(FILE_ERRORS).errors(&[
            E::InvalidPattern,
            E::NotADirectory,
            E::TooManyEntries,
            E::ListingTooLarge,
        ]))
        .add("POST", "/tools/upload_file", s, "Write base64 content checked against its sha256", post(upload_file))
        .doc(
            Doc::new()
                .signed_body::<UploadParams>()
                .ok::<WrittenView>(200)
                .errors(FILE_ERRORS)
                .errors(WRITE_ERRORS)
                .errors(&[E::InvalidBase64, E::Sha256Mismatch]),
        )
        .add(
            "POST",
            "/tools/download_file",
            s,
            "A file's content as base64 with its sha256",
            post(super::reads::download_file),
        )
        .doc(
            Doc::new()
                .signed_body::<super::reads::DownloadParams>()
                .ok::<super::reads::DownloadView>(200)
                .errors(FILE_ERRORS)
                .errors(&[E::IsADirectory, E::TooLarge]),
        )
}

fn bad(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code, message)
}

fn conflict(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, code, message)
}

/// A tool path (`/workspace/...` or relative) as a normalized scope path; `""` is the root, which
/// only directory arguments (`dir = true`) accept.
pub fn tool_path(raw: &str, dir: bool) -> Result<String, ApiError> {
    let rel = if raw == WORKSPACE {
        ""
    } else if let Some(rest) = raw.strip_prefix("/workspace/") {
        rest
    } else if raw.starts_with('/') {
        return Err(PathError::Absolute.into());
    } else {
        raw
    };
    let rel = if rel.trim_matches('/').is_empty() || rel == "." || rel == "./" { "" } else { rel };
    if rel.is_empty() {
        return if dir { Ok(String::new()) } else { Err(PathError::Empty.into()) };
    }
    Ok(vpath::normalize(rel)?)
}

/// The container view of a workspace path (answers use `Target::shown`).
#[cfg(test)]
use crate::services::compute::workspace_path as shown;

fn mtime_secs(a: &Attr) -> f64 {
    a.mtime.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

pub(super) fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Reads a whole regular file of at most `limit` bytes; the attributes are those from before the
/// read (their version is what a later `WriteMode::ReplaceIfUnchanged` compares with).
fn read_whole_versioned(engine: &ScopeEngine, rel: &str, limit: u64) -> Result<(Attr, Vec<u8>), ApiError> {
    let attr = engine.resolve_path(rel).map_err(engine_err)?;
    match attr.kind {
        FileKind::File => {}
        FileKind::Dir => return Err(engine_err(EngineError::IsDir)),
        _ => return Err(engine_err(EngineError::NotFound)),
    }
    if attr.size > limit {
        return Err(ApiError::too_large());
    }
    let data = engine.read_path(rel, 0, limit + 1).map_err(engine_err)?;
    if data.len() as u64 > limit {
        return Err(ApiError::too_large());
    }
    Ok((attr, data))
}

/// Reads a whole regular file of at most `limit` bytes.
pub(super) fn read_whole(engine: &ScopeEngine, rel: &str, limit: u64) -> Result<Vec<u8>, ApiError> {
    read_whole_versioned(engine, rel, limit).map(|(_, data)| data)
}

/// Writes `data` as the new version of `rel` (creating parent directories) as `mode` says.
fn write_whole_as(engine: &ScopeEngine, rel: &str, data: &[u8], limit: u64, mode: WriteMode) -> Result<Attr, ApiError> {
    if data.len() as u64 > limit {
        return Err(ApiError::too_large());
    }
    write_creating_parents(engine, rel, &mut &data[..], limit, mode).map_err(engine_err)
}

fn require_write<T>(req: &SignedRequest<T>) -> Result<(), ApiError> {
    if req.may_write() {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::FORBIDDEN, "read_only", "this thread may not change workspace files"))
    }
}

/// `environment_id`, when sent, names a live environment of the request's scope; otherwise the
/// 404 an unknown environment gets everywhere (another scope's or an ended one included).
pub(super) fn check_environment<T>(
    st: &AppState,
    req: &SignedRequest<T>,
    env_id: Option<&str>,
) -> Result<(), ApiError> {
    let Some(id) = env_id else { return Ok(()) };
    let env = st.compute.registry().environment(&req.scope.scope_id, id).map_err(ServiceError::Registry)?;
    match env {
        Some(env) if env.state.is_live() => Ok(()),
        _ => Err(ComputeError::EnvironmentNotFound.into()),
    }
}

pub(super) fn text(data: Vec<u8>) -> Result<String, ApiError> {
    String::from_utf8(data).map_err(|_| conflict("not_utf8", "the file is not UTF-8 text; use download_file"))
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteParams {
    #[serde(default)]
    environment_id: Option<String>,
    path: String,
    content: String,
}

/// What write_file and upload_file answer.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct WrittenView {
    path: String,
    size_bytes: u64,
    sha256: String,
}

type Written = Result<Json<WrittenView>, ApiError>;
/// The bytes a whole-file tool writes and their sha256 (hex): `text_content`, `base64_content`.
type Content<'a> = Result<(Cow<'a, [u8]>, String), ApiError>;

/// Writes a whole file as a tool: a read-only thread is refused (403) first; then `environment_id`,
/// the path (`place`) and the grant are checked, then the `content` (with its sha256), then it is written.
async fn write_whole_file<P: Send + 'static>(
    st: AppState,
    req: SignedRequest<P>,
    place: fn(&P) -> (Option<&str>, &str),
    content: fn(&P, u64) -> Content<'_>,
) -> Written {
    require_write(&req)?;
    let limit = st.tools.file_limit;
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        let (environment_id, path) = place(&req.body);
        check_environment(&st, &req, environment_id)?;
        let t = target(&st, &req, path, false)?;
        t.check_write(req.grant.as_ref())?;
        let (data, sha256) = content(&req.body, limit)?;
        let attr = write_whole_as(&t.engine, &t.rel, &data, limit, WriteMode::Replace)?;
        Ok(Json(WrittenView { path: t.path(), size_bytes: attr.size, sha256 }))
    })
    .await
}

async fn write_file(State(st): State<AppState>, req: SignedRequest<WriteParams>) -> Written {
    write_whole_file(st, req, |p| (p.environment_id.as_deref(), &p.path), text_content).await
}

fn text_content(p: &WriteParams, limit: u64) -> Content<'_> {
    let data = p.content.as_bytes();
    (data.len() as u64 <= limit).then(|| (Cow::Borrowed(data), sha256_hex(data))).ok_or_else(ApiError::too_large)
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct EditParams {
    #[serde(default)]
    environment_id: Option<String>,
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct EditView {
    path: String,
    replacements: usize,
    lines_removed: usize,
    lines_added: usize,
    size_bytes: u64,
    /// Unified diff of the change, at most `edit_max_diff_bytes`.
    diff: String,
    diff_truncated: bool,
}

/// How often `old` occurs in `text`, refused unless once (or `replace_all`).
fn occurrences(text: &str, old: &str, replace_all: bool) -> Result<usize, ApiError> {
    match text.matches(old).count() {
        0 => Err(conflict("old_string_not_found", "old_string does not occur in the file")),
        n if n > 1 && !replace_all => Err(conflict(
            "old_string_not_unique",
            format!("old_string occurs {n} times; give more context or set replace_all"),
        )),
        n => Ok(n),
    }
}

async fn edit_file(State(st): State<AppState>, req: SignedRequest<EditParams>) -> Result<Json<EditView>, ApiError> {
    require_write(&req)?;
    let limit = st.tools.file_limit;
    let max_diff = usize::try_from(st.tools.limits.edit_max_diff_bytes).unwrap_or(usize::MAX);
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        let p = &req.body;
        check_environment(&st, &req, p.environment_id.as_deref())?;
        let t = target(&st, &req, &p.path, false)?;
        t.check_write(req.grant.as_ref())?;
        if p.old_string.is_empty() {
            return Err(bad("invalid_request", "old_string must not be empty"));
        }
        if p.old_string == p.new_string {
            return Err(bad("invalid_request", "old_string and new_string are the same"));
        }
        let (read, bytes) = read_whole_versioned(&t.engine, &t.rel, limit)?;
        let before = text(bytes)?;
        let count = occurrences(&before, &p.old_string, p.replace_all)?;
        let Some(size) =
            edited_len(before.len(), count, p.old_string.len(), p.new_string.len()).filter(|n| *n as u64 <= limit)
        else {
            limits::refuse(Bound::EditResult);
            return Err(ApiError::too_large());
        };
        let after = replace_bounded(&before, &p.old_string, &p.new_string, size);
        // Replaces only the version that was read: a write in between is never lost (409 file_changed).
        let unchanged = WriteMode::ReplaceIfUnchanged { ino: read.ino, version: read.version };
        let attr = write_whole_as(&t.engine, &t.rel, after.as_bytes(), limit, unchanged)?;
        let (diff, diff_truncated) = unified_diff(&t.path(), &before, &after, max_diff);
        if diff_truncated {
            limits::refuse(Bound::EditDiff);
        }
        let lines = |s: &str| s.lines().count();
        Ok(Json(EditView {
            path: t.path(),
            replacements: count,
            lines_removed: lines(&p.old_string) * count,
            lines_added: lines(&p.new_string) * count,
            size_bytes: attr.size,
            diff,
            diff_truncated,
        }))
    })
    .await
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct DirParams {
    #[serde(default)]
    environment_id: Option<String>,
    #[serde(default = "workspace_root")]
    path: String,
}

fn workspace_root() -> String {
    WORKSPACE.to_string()
}

/// One entry of list_dir.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct DirEntryView {
    name: String,
    path: String,
    #[serde(rename = "type")]
    kind: &'static str,
    size_bytes: u64,
    /// Unix seconds.
    mtime: f64,
}

impl DirEntryView {
    fn of(shown: String, attr: &Attr) -> DirEntryView {
        DirEntryView {
            name: vpath::file_name(&shown).to_string(),
            path: shown,
            kind: file_kind_name(attr.kind),
            size_bytes: attr.size,
            mtime: mtime_secs(attr),
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct DirView {
    path: String,
    entries: Vec<DirEntryView>,
    truncated: bool,
}

/// The listing's charge (`listing_memory_*`) is held until the client has taken the answer.
async fn list_dir(State(st): State<AppState>, req: SignedRequest<DirParams>) -> Result<HeldAnswer, ApiError> {
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        check_environment(&st, &req, req.body.environment_id.as_deref())?;
        let t = target(&st, &req, &req.body.path, true)?;
        let grant = req.grant.as_ref();
        check_list(grant, &t.path())?;
        let (mut entries, charge) = t.engine.list_path(&t.rel, false).map_err(engine_err)?.into_parts();
        entries.retain(|e| grant.is_none_or(|g| g.may_see(&t.shown(&e.path))));
        let truncated = entries.len() > MAX_LIST;
        let entries = entries.iter().take(MAX_LIST).map(|e| DirEntryView::of(t.shown(&e.path), &e.attr)).collect();
        HeldAnswer::json(&DirView { path: t.path(), entries, truncated }, charge)
    })
    .await
}

/// The part of `path` below `base` (`base` may be the root `""`).
fn below<'a>(base: &str, path: &'a str) -> &'a str {
    if base.is_empty() {
        path
    } else {
        path.strip_prefix(base).and_then(|p| p.strip_prefix('/')).unwrap_or(path)
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct GrepParams {
    #[serde(default)]
    environment_id: Option<String>,
    pattern: String,
    #[serde(default = "workspace_root")]
    path: String,
    #[serde(default)]
    glob: Option<String>,
}

/// One matching line of grep_files.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct GrepMatch {
    path: String,
    line_number: usize,
    line: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct GrepView {
    matches: Vec<GrepMatch>,
    files_searched: u64,
    truncated: bool,
}

async fn grep_files(State(st): State<AppState>, req: SignedRequest<GrepParams>) -> Result<HeldAnswer, ApiError> {
    let limit = st.tools.file_limit;
    let bounds = st.tools.limits.clone();
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        let p = &req.body;
        check_environment(&st, &req, p.environment_id.as_deref())?;
        let regex = search::compile_regex(&p.pattern, &bounds)?;
        let t = target(&st, &req, &p.path, true)?;
        let (base, grant) = (t.rel.clone(), req.grant.as_ref());
        check_list(grant, &t.path())?;
        let filter = p.glob.as_deref().map(|g| Glob::parse(g, bounds.glob_max_pattern_bytes)).transpose()?;
        let engine = &t.engine;
        let mut matches = Vec::new();
        let mut files_searched = 0u64;
        let mut answer_bytes = 0u64;
        let mut grep_one = |path: &str, attr: &Attr| -> Result<bool, ApiError> {
            if attr.kind != FileKind::File || attr.size > limit || grant.is_some_and(|g| !g.may_read(&t.shown(path))) {
                return Ok(true);
            }
            if filter.as_ref().is_some_and(|g| !g.matches(below(&base, path))) {
                return Ok(true);
            }
            let data = match engine.read_path(path, 0, limit) {
                Ok(d) => d,
                Err(EngineError::NotFound) => return Ok(true),
                Err(e) => return Err(engine_err(e)),
            };
            files_searched += 1;
            let (found, more) = search::matching_lines(&data, &regex, MAX_GREP_MATCHES - matches.len());
            for (line_number, line) in found {
                let cut = &line[..line.len().min(MAX_LINE)];
                let found =
                    GrepMatch { path: t.shown(path), line_number, line: String::from_utf8_lossy(cut).into_owned() };
                answer_bytes += json_string_len(&found.path) + json_string_len(&found.line) + 64;
                if answer_bytes > MAX_SEARCH_ANSWER_BYTES {
                    return Ok(false);
                }
                matches.push(found);
            }
            Ok(!more)
        };
        let start = engine.resolve_path(&base).map_err(engine_err)?;
        let truncated = if start.kind == FileKind::File {
            !grep_one(&base, &start)?
        } else {
            let budget = WalkBudget::from_limits(&bounds);
            search::walk(engine, &base, (), &budget, |path, attr, _| {
                if grant.is_some_and(|g| !g.may_see(&t.shown(path))) {
                    return Ok(Visit::Skip);
                }
                Ok(if grep_one(path, attr)? { Visit::Descend(()) } else { Visit::Stop })
            })?
        };
        st.tools.held_json(&req.user_id, &GrepView { matches, files_searched, truncated })
    })
    .await
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct GlobParams {
    #[serde(default)]
    environment_id: Option<String>,
    pattern: String,
    #[serde(default = "workspace_root")]
    path: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct GlobView {
    matches: Vec<String>,
    truncated: bool,
}

async fn glob_files(State(st): State<AppState>, req: SignedRequest<GlobParams>) -> Result<HeldAnswer, ApiError> {
    let bounds = st.tools.limits.clone();
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        check_environment(&st, &req, req.body.environment_id.as_deref())?;
        let t = target(&st, &req, &req.body.path, true)?;
        let (base, grant) = (t.rel.clone(), req.grant.as_ref());
        check_list(grant, &t.path())?;
        let pattern = req.body.pattern.strip_prefix(&format!("{}/", t.root())).unwrap_or(&req.body.pattern);
        let glob = Glob::parse(pattern, bounds.glob_max_pattern_bytes)?;
        let (mut found, mut answer_bytes) = (Vec::new(), 0u64);
        let budget = WalkBudget::from_limits(&bounds);
        let truncated = search::walk(&t.engine, &base, glob.start(), &budget, |path, _, state| {
            let view = t.shown(path);
            if grant.is_some_and(|g| !g.may_see(&view)) {
                return Ok(Visit::Skip);
            }
            let name = path.rsplit('/').next().unwrap_or(path);
            let next = glob.step(state, name.as_bytes());
            if glob.accepts(&next) {
                answer_bytes += json_string_len(&view) + 1;
                if found.len() == MAX_GLOB || answer_bytes > MAX_SEARCH_ANSWER_BYTES {
                    return Ok(Visit::Stop);
                }
                found.push(view);
            }
            Ok(if Glob::dead(&next) { Visit::Skip } else { Visit::Descend(next) })
        })?;
        found.sort();
        st.tools.held_json(&req.user_id, &GlobView { matches: found, truncated })
    })
    .await
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct UploadParams {
    #[serde(default)]
    environment_id: Option<String>,
    remote_path: String,
    content_base64: String,
    sha256: String,
}

async fn upload_file(State(st): State<AppState>, req: SignedRequest<UploadParams>) -> Written {
    write_whole_file(st, req, |p| (p.environment_id.as_deref(), &p.remote_path), base64_content).await
}

fn base64_content(p: &UploadParams, limit: u64) -> Content<'_> {
    if p.content_base64.len() as u64 / 4 * 3 > limit + 3 {
        return Err(ApiError::too_large());
    }
    let data =
        BASE64.decode(&p.content_base64).map_err(|_| bad("invalid_base64", "content_base64 is not valid base64"))?;
    let digest = sha256_hex(&data);
    if !digest.eq_ignore_ascii_case(p.sha256.trim()) {
        return Err(bad("sha256_mismatch", "the content does not match sha256"));
    }
    Ok((Cow::Owned(data), digest))
}

#[cfg(test)]
mod tests;
