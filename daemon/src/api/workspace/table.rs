//! The table rows of `/api/workspace*`: each route with its documentation (query parameters,
//! bodies, answers and error codes) for the OpenAPI document.

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post, put};

use super::super::error::ErrorCode as E;
use super::super::routes::{Auth, Doc, RouteTable};
use super::super::AppState;
use super::imports::{import, imports, ImportBody, ImportView, ImportsPage};
use super::{
    delete_file, download, list, read_file, upload, usage, write_file, EntryView, ListView, UploadView, UsageView,
};

/// The `threadId` query parameter.
const THREAD: &str = "the primary thread whose workspace this is";
/// The `snapshotId` query parameter of the reading routes.
const SNAPSHOT: &str = "read this snapshot of the thread's scope instead of its live files";
/// What every workspace route can answer (seed 000 §8.2: one 404 for a thread and a file).
const WS_ERRORS: &[E] = &[
    E::InvalidThreadId,
    E::InvalidPath,
    E::NotFound,
    E::ScopeDeleting,
    E::ScopeBusy,
    E::ScopeUnavailable,
    E::ObjectStoreUnavailable,
    E::EngineError,
    E::RegistryError,
];
/// What a route that writes files can answer besides.
const WS_WRITE_ERRORS: &[E] = &[
    E::SnapshotReadOnly,
    E::TooLarge,
    E::InvalidBody,
    E::FileExists,
    E::IsADirectory,
    E::NotADirectory,
    E::NotPermitted,
    E::QuotaExceeded,
    E::NoSpace,
];

/// Adds the workspace file routes to the table.
pub fn add_routes(table: RouteTable<AppState>) -> RouteTable<AppState> {
    table
        .add(
            "GET",
            "/api/workspace",
            Auth::Service,
            "List a workspace directory (threadId, path, recursive)",
            get(list),
        )
        .doc(
            Doc::new()
                .param("threadId", true, THREAD)
                .param("path", false, "directory relative to the workspace root (default: the root)")
                .param("recursive", false, "1: the whole tree below path")
                .param("snapshotId", false, SNAPSHOT)
                .ok::<ListView>(200)
                .errors(WS_ERRORS)
                .errors(&[E::NotADirectory, E::TooManyEntries, E::ListingTooLarge]),
        )
        .add(
            "POST",
            "/api/workspace/upload",
            Auth::Service,
            "Multipart upload of one or more files (threadId, dir, overwrite)",
            post(upload).layer(DefaultBodyLimit::disable()),
        )
        .doc(
            Doc::new()
                .param("threadId", true, THREAD)
                .param("dir", false, "target directory (a text part `dir` before the files sets it too)")
                .param("overwrite", false, "1: atomically replace existing files (default: 409 file_exists)")
                .param("snapshotId", false, "refused: a snapshot cannot be changed")
                .body_media("multipart/form-data")
                .ok::<UploadView>(201)
                .errors(WS_ERRORS)
                .errors(WS_WRITE_ERRORS)
                .errors(&[E::InvalidMultipart, E::NoFiles]),
        )
        .add(
            "GET",
            "/api/workspace/file",
            Auth::Service,
            "File content, with Range support (threadId, path, download)",
            get(read_file),
        )
        .doc(
            Doc::new()
                .param("threadId", true, THREAD)
                .param("path", true, "file path relative to the workspace root")
                .param("download", false, "1: Content-Disposition attachment")
                .param("snapshotId", false, SNAPSHOT)
                .header(
                    "Range",
                    "bytes=START-END, START- or -SUFFIX: answered 206 (416 outside the file; several ranges: 200)",
                )
                .ok_media(200, "*/*")
                .ok_media(206, "*/*")
                .errors(WS_ERRORS)
                .errors(&[E::IsADirectory, E::RangeNotSatisfiable, E::ReadFailed]),
        )
        .add(
            "PUT",
            "/api/workspace/file",
            Auth::Service,
            "Write the body as the file's new version (atomic replace)",
            put(write_file).layer(DefaultBodyLimit::disable()),
        )
        .doc(
            Doc::new()
                .param("threadId", true, THREAD)
                .param("path", true, "file path relative to the workspace root")
                .param("snapshotId", false, "refused: a snapshot cannot be changed")
                .body_media("application/octet-stream")
                .ok::<EntryView>(200)
                .errors(WS_ERRORS)
                .errors(WS_WRITE_ERRORS),
        )
        .add(
            "DELETE",
            "/api/workspace/file",
            Auth::Service,
            "Delete a file (recursive=1 for a directory)",
            delete(delete_file),
        )
        .doc(
            Doc::new()
                .param("threadId", true, THREAD)
                .param("path", true, "file or directory path relative to the workspace root")
                .param("recursive", false, "1: delete a directory and everything below it")
                .param("snapshotId", false, "refused: a snapshot cannot be changed")
                .ok_empty(204)
                .errors(WS_ERRORS)
                .errors(&[
                    E::SnapshotReadOnly,
                    E::DirectoryNotEmpty,
                    E::IsADirectory,
                    E::NotADirectory,
                    E::NotPermitted,
                ]),
        )
        .add("GET", "/api/workspace/download", Auth::Service, "Streaming zip of the workspace's files", get(download))
        .doc(
            Doc::new()
                .param("threadId", true, THREAD)
                .param("snapshotId", false, SNAPSHOT)
                .ok_media(200, "application/zip")
                .errors(WS_ERRORS)
                .errors(&[E::TooManyEntries, E::ListingTooLarge]),
        )
        .add("GET", "/api/workspace/usage", Auth::Service, "File count, bytes and quota of the workspace", get(usage))
        .doc(Doc::new().param("threadId", true, THREAD).ok::<UsageView>(200).errors(WS_ERRORS))
        .add(
            "POST",
            "/api/workspace/import",
            Auth::Service,
            "Copy one file from the read-only legacy workspace (idempotent, audited)",
            post(import),
        )
        .doc(
            Doc::new()
                .param("threadId", true, THREAD)
                .body::<ImportBody>()
                .ok::<ImportView>(201)
                .ok::<ImportView>(200)
                .errors(WS_ERRORS)
                .errors(WS_WRITE_ERRORS)
                .errors(&[E::LegacyUnavailable, E::IdempotencyKeyConflict, E::InvalidRequest]),
        )
        .add(
            "GET",
            "/api/workspace/imports",
            Auth::Service,
            "The thread's legacy imports, oldest first (the import answer's fields plus state: applying | \
             completed); a page: after (an idempotency_key), limit (1-500, default 100); {imports, next_after}",
            get(imports),
        )
        .doc(
            Doc::new()
                .param("threadId", true, THREAD)
                .param("after", false, "the idempotency_key of the last record of the previous page")
                .param("limit", false, "records per page, 1-500 (default 100)")
                .ok::<ImportsPage>(200)
                .errors(WS_ERRORS)
                .errors(&[E::InvalidLimit]),
        )
}
