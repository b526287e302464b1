//! `/api/workspace*`: the WebUI's workspace file routes (SPEC §7.2, seed 000 §8): list, upload, read
//! (with `Range`), write, delete, zip download, usage and legacy import.
//!
//! Conventions:
//! - `threadId` (required) selects the scope; a malformed one is 400, an unknown one is the same 404
//!   as a missing file (`ApiError::workspace`), a scope being deleted is 409.
//! - `path` is relative to the workspace root (rules in `scopefs::vpath`); the display form
//!   (`/paper.pdf`) is accepted too, so an answer's `virtual_path` can be sent back as `path`.
//!   Answers carry `path` (relative, for the API) and `virtual_path` (`/paper.pdf`, for chat messages).
//! - Upload: `POST /api/workspace/upload?threadId=&dir=&overwrite=1`, multipart; every part with a
//!   filename is a file (its filename may contain sub-directories); a text part `dir` (before the files)
//!   sets the target directory. Default is exclusive create (409 `file_exists`); `overwrite=1`
//!   atomically replaces. Parts are written one after another: a failure stops the upload, files
//!   written before it stay.
//! - `PUT /api/workspace/file` writes the body as a new version (atomic replace, creates the file).
//!   Uploads and writes create missing parent directories; files get the owner of the workspace root.
//! - Content over `max_upload_bytes` is 413 and leaves no file behind (the engine builds the file
//!   unnamed and links it only when complete).
//! - Symlinks are never followed: reading one is 404, the zip leaves them out.
//! - Engine work runs on blocking threads; bodies stream through bounded channels.

use std::io::{self, Read};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::body::{Body, Bytes};
use axum::extract::multipart::MultipartRejection;
use axum::extract::{FromRequestParts, Multipart, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::{Stream, StreamExt};
use scopefs::engine::{Attr, FileKind, Listing, ScopeEngine, WriteMode};
use scopefs::ids::{ScopeId, ThreadId};
use scopefs::registry::{ScopeRecord, ScopeState};
use scopefs::vpath;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

mod headers;
mod imports;
mod table;
mod zipstream;

use super::extract::ApiQuery;
use super::held_answer::HeldAnswer;
use super::{blocking_as, file_kind_name, ApiError, AppState};
use crate::pools::{RouteClass, Share};
use crate::services::files::{write_creating_parents, EngineFileReader};
use crate::services::ServiceError;
use headers::{content_type, disposition, parse_range, RangeAsk};
pub use table::add_routes;
use zipstream::{write_zip, ChannelWriter};

/// Chunks in flight between a blocking engine thread and the HTTP body.
const CHANNEL_DEPTH: usize = 4;
/// Size of one streamed chunk.
const CHUNK: usize = 128 * 1024;
/// See [`super::stream_buffer_bytes`].
pub fn stream_buffer_bytes() -> u64 {
    let piece = CHUNK.max(crate::http::CONNECTION_BUFFER_BYTES) as u64;
    (CHANNEL_DEPTH as u64 + 2) * piece + scopefs::engine::WRITE_FILL_BYTES
}

/// The query parameters of every workspace route (names as the WebUI sends them).
#[derive(Debug, Default, Deserialize)]
struct WsQuery {
    #[serde(rename = "threadId")]
    thread_id: Option<String>,
    path: Option<String>,
    dir: Option<String>,
    recursive: Option<String>,
    download: Option<String>,
    overwrite: Option<String>,
    /// Read a snapshot of the thread's scope instead of its live files (listing, file, zip).
    #[serde(rename = "snapshotId")]
    snapshot_id: Option<String>,
    /// A page of the import listing: after this idempotency key, at most `limit` (1-500) records.
    after: Option<String>,
    limit: Option<String>,
}

impl WsQuery {
    /// Refuses `snapshotId` on a route that changes files (a snapshot is read-only).
    fn live_only(&self) -> Result<(), ApiError> {
        match self.snapshot_id {
            Some(_) => {
                Err(ApiError::new(StatusCode::BAD_REQUEST, "snapshot_read_only", "a snapshot cannot be changed"))
            }
            None => Ok(()),
        }
    }

    /// A required file path.
    fn file_path(&self) -> Result<String, ApiError> {
        Ok(vpath::normalize_virtual(self.path.as_deref().unwrap_or(""))?)
    }
}

/// The arguments of every workspace route: the query, and its `threadId` validated (400
/// `invalid_thread_id`) before anything else of the request is looked at.
struct WsArgs {
    thread: ThreadId,
    q: WsQuery,
}

impl<S: Send + Sync> FromRequestParts<S> for WsArgs {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let ApiQuery(q) = ApiQuery::<WsQuery>::from_request_parts(parts, state).await?;
        let thread = ThreadId::parse(q.thread_id.as_deref().unwrap_or(""))?;
        Ok(WsArgs { thread, q })
    }
}

fn flag(v: &Option<String>) -> bool {
    matches!(v.as_deref(), Some("1" | "true" | "yes"))
}

/// [`blocking_as`] on the `/api` pool for the work of `thread`'s scope (at most
/// `limits.route_workers_per_scope` of the pool's workers), failures mapped as workspace errors
/// (`ApiError::workspace`).
async fn run<T, F>(thread: Share, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ServiceError> + Send + 'static,
{
    blocking_as(RouteClass::Api, thread, move || f().map_err(ApiError::workspace)).await
}

/// The share of the `/api` pool a request for `thread` runs in (its scope is not known yet).
fn of(thread: &ThreadId) -> Share {
    Share { scope: format!("thread:{}", thread.as_str()), user: None }
}

async fn scope_engine(st: &AppState, thread: ThreadId) -> Result<(ScopeRecord, Arc<ScopeEngine>), ApiError> {
    let service = st.files.clone();
    run(of(&thread), move || service.engine_for_thread(&thread)).await
}

fn millis(attr: &Attr) -> i64 {
    attr.mtime.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The kinds the workspace API shows; any other is `"other"`.
fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File | FileKind::Dir | FileKind::Symlink => file_kind_name(kind),
        _ => "other",
    }
}

/// One file or directory as the API shows it: virtual paths only.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct EntryView {
    name: String,
    path: String,
    virtual_path: String,
    #[serde(rename = "type")]
    kind: &'static str,
    size: u64,
    /// Unix milliseconds.
    mtime: i64,
}

impl EntryView {
    fn of(path: &str, attr: &Attr) -> EntryView {
        EntryView {
            name: vpath::file_name(path).to_string(),
            path: path.to_string(),
            virtual_path: vpath::virtual_path(path),
            kind: kind_name(attr.kind),
            size: if attr.kind == FileKind::File { attr.size } else { 0 },
            mtime: millis(attr),
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct ScopeBrief {
    scope_id: ScopeId,
    state: ScopeState,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct ListView {
    path: String,
    scope: ScopeBrief,
    entries: Vec<EntryView>,
}

/// The listing's charge (`listing_memory_*`) is held until the client has taken the answer.
async fn list(State(st): State<AppState>, WsArgs { thread, q }: WsArgs) -> Result<HeldAnswer, ApiError> {
    let dir = vpath::normalize_virtual_dir(q.path.as_deref().unwrap_or(""))?;
    let recursive = flag(&q.recursive);
    let service = st.files.clone();
    let snapshot = q.snapshot_id.clone();
    let listed = dir.clone();
    let (rec, listing): (ScopeRecord, Listing) = run(of(&thread), move || {
        let (rec, engine) = service.engine_for_thread_at(&thread, snapshot.as_deref())?;
        Ok((rec, engine.list_path(&listed, recursive)?))
    })
    .await?;
    let (entries, charge) = listing.into_parts();
    let view = ListView {
        path: dir,
        scope: ScopeBrief { scope_id: rec.scope_id, state: rec.state },
        entries: entries.iter().map(|e| EntryView::of(&e.path, &e.attr)).collect(),
    };
    drop(entries);
    HeldAnswer::json(&view, charge)
}

/// Runs `f`, the blocking half of a streamed body, on a thread of its own that holds one of the
/// scope's `max_inflight_per_scope` slots for the stream's whole length (429 `scope_busy` when none
/// is free). Streams are bounded per scope rather than by the `/api` class pool, where one slow
/// client would hold a class worker for as long as it reads.
fn spawn_stream<T: Send + 'static>(
    scope: &ScopeId,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<tokio::task::JoinHandle<T>, ApiError> {
    let slot = crate::pools::scope_slot(scope.as_str())?;
    Ok(tokio::task::spawn_blocking(move || {
        let _slot = slot;
        f()
    }))
}

/// Feeds a blocking reader from an async channel of chunks.
struct ChannelReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(e)) => return Err(e),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current = self.current.slice(n..);
        Ok(n)
    }
}

/// Writes `stream` as a new version of `path` (missing parents created) on a blocking thread.
async fn write_from_stream<S, E>(
    engine: Arc<ScopeEngine>,
    path: String,
    max_len: u64,
    mode: WriteMode,
    stream: S,
    stream_error: fn(E) -> ApiError,
) -> Result<Attr, ApiError>
where
    S: Stream<Item = Result<Bytes, E>>,
{
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(CHANNEL_DEPTH);
    let scope = engine.scope_id().clone();
    let task = spawn_stream(&scope, move || -> Result<Attr, ServiceError> {
        let mut reader = ChannelReader { rx, current: Bytes::new() };
        Ok(write_creating_parents(&engine, &path, &mut reader, max_len, mode)?)
    })?;
    let mut stream = std::pin::pin!(stream);
    let mut failed_stream = None;
    // Once the engine has stopped reading (limit, quota, ...) the rest of the body is left to the
    // `unread_body` middleware, which drains it after the answer is decided.
    while let Some(item) = stream.next().await {
        match item {
            Ok(chunk) => {
                if tx.send(Ok(chunk)).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                let _ = tx.send(Err(io::Error::other("request body interrupted"))).await;
                failed_stream = Some(e);
                break;
            }
        }
    }
    drop(tx);
    let written = match task.await {
        Ok(r) => r,
        Err(join) => return Err(ApiError::internal("task_failed", &join)),
    };
    match (written, failed_stream) {
        (Ok(attr), None) => Ok(attr),
        // The body broke first; the engine saw an I/O error and left nothing behind.
        (Err(ServiceError::Engine(scopefs::engine::EngineError::Io(_))), Some(e)) => Err(stream_error(e)),
        (Err(e), _) => Err(ApiError::workspace(e)),
        (Ok(_), Some(e)) => Err(stream_error(e)),
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct UploadView {
    files: Vec<EntryView>,
}

async fn upload(
    State(st): State<AppState>,
    WsArgs { thread, q }: WsArgs,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<(StatusCode, Json<UploadView>), ApiError> {
    q.live_only()?;
    let mut dir = vpath::normalize_virtual_dir(q.dir.as_deref().unwrap_or(""))?;
    let mode = if flag(&q.overwrite) { WriteMode::Replace } else { WriteMode::CreateNew };
    let mut multipart = multipart?;
    let (_, engine) = scope_engine(&st, thread).await?;
    let max_len = st.files.settings().max_upload_bytes;
    let mut files = Vec::new();
    while let Some(field) = multipart.next_field().await? {
        let Some(file_name) = field.file_name().map(str::to_owned) else {
            if field.name() == Some("dir") {
                dir = vpath::normalize_virtual_dir(&field.text().await?)?;
            }
            continue;
        };
        let path = vpath::join(&dir, &file_name)?;
        let attr = write_from_stream(engine.clone(), path.clone(), max_len, mode, field, ApiError::from).await?;
        files.push(EntryView::of(&path, &attr));
    }
    if files.is_empty() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "no_files", "the upload contained no file part"));
    }
    Ok((StatusCode::CREATED, Json(UploadView { files })))
}

async fn write_file(
    State(st): State<AppState>,
    WsArgs { thread, q }: WsArgs,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<EntryView>, ApiError> {
    q.live_only()?;
    let path = q.file_path()?;
    let max_len = st.files.settings().max_upload_bytes;
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_len) {
        return Err(ApiError::too_large());
    }
    let (_, engine) = scope_engine(&st, thread).await?;
    let stream = body.into_data_stream();
    let body_error =
        |_e: axum::Error| ApiError::new(StatusCode::BAD_REQUEST, "invalid_body", "the request body broke off");
    let attr = write_from_stream(engine, path.clone(), max_len, WriteMode::Replace, stream, body_error).await?;
    Ok(Json(EntryView::of(&path, &attr)))
}

async fn delete_file(State(st): State<AppState>, WsArgs { thread, q }: WsArgs) -> Result<StatusCode, ApiError> {
    q.live_only()?;
    let path = q.file_path()?;
    let recursive = flag(&q.recursive);
    let service = st.files.clone();
    run(of(&thread), move || {
        let (_, engine) = service.engine_for_thread(&thread)?;
        Ok(engine.remove_path(&path, recursive)?)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A body fed by a blocking producer through a bounded channel.
fn channel_body(rx: mpsc::Receiver<io::Result<Bytes>>) -> Body {
    Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) }))
}

/// Streams `reader` into a channel on a blocking thread (stops when the client goes away).
fn spawn_reader(mut reader: EngineFileReader, scope: ScopeId) -> Result<Body, ApiError> {
    let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
    spawn_stream(&scope.clone(), move || {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx.blocking_send(Ok(Bytes::copy_from_slice(&buf[..n]))).is_err() {
                        break;
                    }
                }
                Err(e) => {
                    tracing::error!(scope_id = %scope, error = %e, "reading a file for download failed");
                    let _ = tx.blocking_send(Err(e));
                    break;
                }
            }
        }
    })?;
    Ok(channel_body(rx))
}

/// The plan of one read: the opened file and the part to send.
struct ReadPlan {
    attr: Attr,
    ask: RangeAsk,
    scope: ScopeId,
    reader: Option<EngineFileReader>,
}

async fn read_file(
    State(st): State<AppState>,
    WsArgs { thread, q }: WsArgs,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let path = q.file_path()?;
    let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let service = st.files.clone();
    let snapshot = q.snapshot_id.clone();
    let lookup = path.clone();
    let plan = run(of(&thread), move || {
        let (rec, engine) = service.engine_for_thread_at(&thread, snapshot.as_deref())?;
        let attr = engine.resolve_path(&lookup)?;
        match attr.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(scopefs::engine::EngineError::IsDir.into()),
            _ => return Err(scopefs::engine::EngineError::NotFound.into()),
        }
        let ask = parse_range(range.as_deref(), attr.size);
        let reader = match ask {
            RangeAsk::Whole => Some(EngineFileReader::open(engine, attr.ino, 0, attr.size)?),
            RangeAsk::Part(start, end) => Some(EngineFileReader::open(engine, attr.ino, start, end)?),
            RangeAsk::Unsatisfiable => None,
        };
        Ok(ReadPlan { attr, ask, scope: rec.scope_id, reader })
    })
    .await?;
    let size = plan.attr.size;
    let (status, len, content_range) = match plan.ask {
        RangeAsk::Whole => (StatusCode::OK, size, None),
        RangeAsk::Part(start, end) => {
            (StatusCode::PARTIAL_CONTENT, end - start, Some(format!("bytes {start}-{}/{size}", end - 1)))
        }
        RangeAsk::Unsatisfiable => {
            let mut resp = ApiError::range_not_satisfiable().into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                resp.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return Ok(resp);
        }
    };
    let Some(reader) = plan.reader else {
        return Err(ApiError::internal("read_failed", &"no reader for a satisfiable range"));
    };
    let name = vpath::file_name(&path);
    let mut resp = Response::new(spawn_reader(reader, plan.scope)?);
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type(name)));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("default-src 'none'; sandbox"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, no-cache"));
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{}-{}\"", plan.attr.ino, plan.attr.version)) {
        h.insert(header::ETAG, etag);
    }
    if let Some(cr) = content_range.and_then(|v| HeaderValue::from_str(&v).ok()) {
        h.insert(header::CONTENT_RANGE, cr);
    }
    let kind = if flag(&q.download) { "attachment" } else { "inline" };
    h.insert(header::CONTENT_DISPOSITION, disposition(kind, name));
    Ok(resp)
}

async fn download(State(st): State<AppState>, WsArgs { thread, q }: WsArgs) -> Result<Response, ApiError> {
    let service = st.files.clone();
    let snapshot = q.snapshot_id;
    let name = format!("workspace-{}.zip", thread.as_str());
    let (rec, engine, entries) = run(of(&thread), move || {
        let (rec, engine) = service.engine_for_thread_at(&thread, snapshot.as_deref())?;
        let entries = engine.list_path("", true)?;
        Ok((rec, engine, entries))
    })
    .await?;
    let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
    let scope = rec.scope_id;
    spawn_stream(&scope.clone(), move || {
        let writer = ChannelWriter { tx: tx.clone(), buf: Vec::with_capacity(CHUNK) };
        if let Err(e) = write_zip(&engine, &entries, writer) {
            if e.kind() != io::ErrorKind::BrokenPipe {
                tracing::error!(scope_id = %scope, error = %e, "writing the workspace zip failed");
                let _ = tx.blocking_send(Err(e));
            }
        }
    })?;
    let mut resp = Response::new(channel_body(rx));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/zip"));
    h.insert(header::CONTENT_DISPOSITION, disposition("attachment", &name));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, no-store"));
    Ok(resp)
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct QuotaView {
    bytes: u64,
    inodes: u64,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
struct UsageView {
    files: u64,
    bytes: u64,
    inodes: u64,
    quota: QuotaView,
}

async fn usage(State(st): State<AppState>, WsArgs { thread, .. }: WsArgs) -> Result<Json<UsageView>, ApiError> {
    let service = st.files.clone();
    let (usage, quota) = run(of(&thread), move || {
        let (_, engine) = service.engine_for_thread(&thread)?;
        Ok((engine.usage()?, engine.quota()))
    })
    .await?;
    Ok(Json(UsageView {
        files: usage.files,
        bytes: usage.bytes,
        inodes: usage.inodes,
        quota: QuotaView { bytes: quota.bytes, inodes: quota.inodes },
    }))
}
