//! `POST /api/workspace/import` and `GET /api/workspace/imports`: files copied from the read-only
//! legacy workspace (idempotent on their key, audited), and the thread's record of them.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use scopefs::registry::imports::{ImportRecord, ImportRequest};
use scopefs::vpath;
use serde::{Deserialize, Serialize};

use super::super::extract::ApiJson;
use super::super::ApiError;
use super::super::AppState;
use super::{of, run, WsArgs};

/// First components of the legacy workspace that are never importable (its private control data).
const LEGACY_HIDDEN: &[&str] = &[".evoscientist"];

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ImportBody {
    /// Relative to the legacy workspace root.
    source_path: String,
    /// Relative to the scope root; defaults to `source_path`.
    target_path: Option<String>,
    idempotency_key: String,
    /// Replace an existing target (default: refuse with 409 `file_exists`).
    #[serde(default)]
    overwrite: bool,
}

/// What one import copied (both routes show it).
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(super) struct ImportedFile {
    idempotency_key: String,
    source_path: String,
    path: String,
    virtual_path: String,
    size: u64,
    sha256: String,
    /// Unix milliseconds.
    imported_at: i64,
}

impl ImportedFile {
    fn of(rec: ImportRecord) -> ImportedFile {
        ImportedFile {
            idempotency_key: rec.request.idempotency_key,
            source_path: rec.request.source_path,
            virtual_path: vpath::virtual_path(&rec.request.target_path),
            path: rec.request.target_path,
            size: rec.size_bytes.unwrap_or(0),
            sha256: rec.sha256.unwrap_or_default(),
            imported_at: rec.completed_at.unwrap_or(rec.created_at),
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(super) struct ImportView {
    #[serde(flatten)]
    file: ImportedFile,
    /// Whether an earlier request with this key did the copy.
    replayed: bool,
}

pub(super) async fn import(
    State(st): State<AppState>,
    WsArgs { thread, .. }: WsArgs,
    ApiJson(body): ApiJson<ImportBody>,
) -> Result<(StatusCode, Json<ImportView>), ApiError> {
    let source = vpath::normalize(&body.source_path)?;
    let target = vpath::normalize_virtual(body.target_path.as_deref().unwrap_or(&source))?;
    if st.files.settings().legacy_root.is_none() {
        return Err(ApiError::legacy_unavailable());
    }
    if LEGACY_HIDDEN.iter().any(|h| source.split('/').next() == Some(*h)) {
        return Err(ApiError::workspace_not_found());
    }
    let req = ImportRequest {
        idempotency_key: body.idempotency_key,
        source_path: source,
        target_path: target,
        overwrite: body.overwrite,
    };
    let service = st.files.clone();
    let outcome = run(of(&thread), move || service.import_legacy(&thread, req)).await?;
    let view = ImportView { file: ImportedFile::of(outcome.record), replayed: outcome.replayed };
    let status = if outcome.replayed { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(view)))
}

/// Most records one page of `/api/workspace/imports` holds.
const MAX_IMPORTS_PAGE: usize = 500;

/// One legacy import of the thread.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(super) struct ImportRecordView {
    #[serde(flatten)]
    file: ImportedFile,
    /// `applying` or `completed`.
    state: &'static str,
}

/// A page of the thread's legacy imports.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(super) struct ImportsPage {
    imports: Vec<ImportRecordView>,
    /// Pass as `after` for the next page; `null` on the last one.
    next_after: Option<String>,
}

pub(super) async fn imports(
    State(st): State<AppState>,
    WsArgs { thread, q }: WsArgs,
) -> Result<Json<ImportsPage>, ApiError> {
    let limit = match q.limit.as_deref() {
        None => 100,
        Some(l) => l
            .parse()
            .ok()
            .filter(|n| (1..=MAX_IMPORTS_PAGE).contains(n))
            .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "invalid_limit", "limit must be 1-500"))?,
    };
    let service = st.files.clone();
    let records = run(of(&thread), move || service.imports(&thread, q.after.as_deref(), limit)).await?;
    let next_after = (records.len() == limit).then(|| records.last().map(|r| r.request.idempotency_key.clone()));
    let imports = records
        .into_iter()
        .map(|rec| {
            let state = rec.state.as_str();
            ImportRecordView { file: ImportedFile::of(rec), state }
        })
        .collect();
    Ok(Json(ImportsPage { imports, next_after: next_after.flatten() }))
}
