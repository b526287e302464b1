//! Where a file tool's path points: the request's own `/workspace` (the default, and relative
//! paths), or a `/threads/{thread_id}/…` or `/__global__/…` view of another scope of the same
//! user (seed 003 §3.3, §6.2; which scope, and who may see it: `services::peers`).
//!
//! Conversations are isolated by default (seed 000 §4: A's tools cannot see B's files): with
//! `peer_views = "granted"` a request reaches a view only when its signed `object_scope` names
//! paths (403 `object_scope_denied` without one), the same kind of signed grant containers need
//! (`input_objects`); `peer_views = "open"` lets any request of the same user read them.
//!
//! The same rules as everywhere else apply on the full path (`object_scope` checks included). A
//! `/threads/…` view is read-only (writing is 403 `read_only`); `/__global__` may be written only
//! when the request's `object_scope` has a write prefix covering the path (seed 003 §3.7: the
//! global store is the user's read-write store, but a request that names no such grant only reads).

use std::sync::Arc;

use axum::http::StatusCode;
use scopefs::config::PeerViews;
use scopefs::engine::ScopeEngine;
use scopefs::vpath::{self, PathError};

use super::super::{ApiError, AppState};
use super::auth::SignedRequest;
use super::files::tool_path;
use super::object_scope::{self, ObjectScope};
use crate::services::peers::View;

/// The scope and path a file tool acts on.
pub struct Target {
    pub engine: Arc<ScopeEngine>,
    /// The normalized path in that scope (`""`: its root).
    pub rel: String,
    /// `/workspace`, `/threads/{thread_id}` or `/__global__`.
    root: String,
    view: Option<View>,
}

impl Target {
    /// How answers name `rel`, a path of this target's scope.
    pub fn shown(&self, rel: &str) -> String {
        if rel.is_empty() {
            self.root.clone()
        } else {
            format!("{}/{rel}", self.root)
        }
    }

    /// `/workspace`, `/threads/{thread_id}` or `/__global__`.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The target's own path as answers name it.
    pub fn path(&self) -> String {
        self.shown(&self.rel)
    }

    /// Refuses writing the target beyond its rules (module docs), else `object_scope` decides.
    pub fn check_write(&self, grant: Option<&ObjectScope>) -> Result<(), ApiError> {
        match (&self.view, grant) {
            (Some(View::Thread(_)), _) => {
                Err(ApiError::new(StatusCode::FORBIDDEN, "read_only", "another thread's files are read-only"))
            }
            (Some(View::Global), None) => {
                Err(ApiError::object_scope_denied("writing /__global__ without a write prefix"))
            }
            _ => object_scope::check_write(grant, &self.path()),
        }
    }
}

/// Resolves a tool path for `req` (`dir`: the root of a scope is accepted, for directory tools).
/// Another user's thread, or one that does not exist, is 404 like an unknown thread.
pub fn target<T>(st: &AppState, req: &SignedRequest<T>, raw: &str, dir: bool) -> Result<Target, ApiError> {
    let Some(split) = View::split(raw) else {
        let rel = tool_path(raw, dir)?;
        let root = "/workspace".to_string();
        return Ok(Target { engine: req.engine.clone(), rel, root, view: None });
    };
    let (view, rest) = split.map_err(|_| ApiError::from(PathError::Absolute))?;
    if st.tools.peer_views == PeerViews::Granted && req.grant.is_none() {
        return Err(ApiError::object_scope_denied(
            "reading another conversation's files or the global store: without a signed object_scope naming the path, a request reaches its own /workspace only",
        ));
    }
    let rel = match rest.trim_matches('/') {
        "" if dir => String::new(),
        "" => return Err(PathError::Empty.into()),
        r => vpath::normalize(r)?,
    };
    let (_, engine) = st.files.view_engine(&req.user_id, &view).map_err(ApiError::tools)?;
    Ok(Target { engine, rel, root: view.root(), view: Some(view) })
}
