//! `ApiError`: the one place where failures become HTTP statuses and `{"error":{"code","message"}}` bodies.

use axum::extract::multipart::{MultipartError, MultipartRejection};
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use scopefs::engine::{EngineError, Refusal};
use scopefs::ids::IdError;
use scopefs::registry::{RegistryError, ScopeState};
use scopefs::signing::SigningError;
use scopefs::vpath::PathError;

use crate::services::ServiceError;

mod codes;
pub use codes::ErrorCode;

/// The body of every error answer: `{"error": {"code", "message"}}`.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What failed: a code of [`ErrorCode`] and a human-readable message.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct ErrorDetail {
    #[schemars(with = "ErrorCode")]
    pub code: &'static str,
    pub message: String,
}

/// An HTTP error answer. 5xx details are logged, never returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// The path or symlink rule this answer refuses a request for, if any: counted for
    /// `scopefs_refused_total{via="api"}` once, when the answer is sent (`into_response`).
    refusal: Option<Refusal>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), refusal: None }
    }

    /// The same answer, marked as a refusal of `kind` (see the `refusal` field).
    fn refusing(self, kind: Option<Refusal>) -> ApiError {
        ApiError { refusal: kind, ..self }
    }

    pub fn unauthorized() -> ApiError {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", "a valid bearer token is required")
    }

    pub fn not_ready() -> ApiError {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", "the daemon is starting or stopping")
    }

    pub fn route_not_found() -> ApiError {
        Self::new(StatusCode::NOT_FOUND, "not_found", "no such route")
    }

    pub fn method_not_allowed() -> ApiError {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this route")
    }

    /// The admin page's login form with a token that does not match (`/admin/ui/login`).
    pub fn admin_login_failed() -> ApiError {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", "the admin token does not match")
    }

    /// An admin page form without its session's CSRF token, or a cross-site login post.
    pub fn csrf_refused() -> ApiError {
        Self::new(StatusCode::FORBIDDEN, "csrf_refused", "the form is not from this admin page; reload it")
    }

    /// The admin page holds its most live sessions already (`admin_ui::session::MAX_SESSIONS`).
    pub fn admin_sessions_full() -> ApiError {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "admin_sessions_full", "too many admin sessions; log out of one")
    }

    /// The one 404 of the workspace routes: an unknown thread, another scope's path and a missing
    /// file look exactly alike (seed 000 §8.2), so nothing about other scopes leaks.
    pub fn workspace_not_found() -> ApiError {
        Self::new(StatusCode::NOT_FOUND, "not_found", "no such file or workspace")
    }

    /// A signed `auth_context.object_scope` does not grant this access (seed 003 §4.7: 403,
    /// `ComputePermissionDenied`); `what` says which access, never a path.
    pub fn object_scope_denied(what: &str) -> ApiError {
        Self::new(StatusCode::FORBIDDEN, "object_scope_denied", format!("object_scope does not grant {what}"))
    }

    /// A `Range` outside the file (the handler adds `Content-Range: bytes */<size>`).
    pub fn range_not_satisfiable() -> ApiError {
        Self::new(StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable", "the requested range is outside the file")
    }

    /// Content over `max_upload_bytes`.
    pub fn too_large() -> ApiError {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", "content larger than the upload limit")
    }

    /// Import asked for while no `legacy_root` is configured.
    pub fn legacy_unavailable() -> ApiError {
        Self::new(StatusCode::NOT_FOUND, "legacy_unavailable", "no legacy workspace is configured")
    }

    /// A failure of a `/api/workspace*` route: like `From<ServiceError>`, except that an unknown
    /// thread and a missing file are the same 404, and a deleting scope is 409 `scope_deleting`.
    pub fn workspace(e: ServiceError) -> ApiError {
        match &e {
            ServiceError::ScopeNotFound | ServiceError::Engine(EngineError::NotFound) => Self::workspace_not_found(),
            ServiceError::NotMountable(ScopeState::Deleting) | ServiceError::Engine(EngineError::ReadOnly) => {
                Self::new(StatusCode::CONFLICT, "scope_deleting", "the workspace is being deleted")
            }
            _ => ApiError::from(e),
        }
    }

    /// A failure of a `/tools/*` route (seed 003 §4.7): a thread without a workspace is 404
    /// `scope_not_found`, a missing file 404 `file_not_found`, a scope being deleted 409 `scope_deleting`.
    pub fn tools(e: ServiceError) -> ApiError {
        match &e {
            ServiceError::ScopeNotFound => {
                Self::new(StatusCode::NOT_FOUND, "scope_not_found", "no workspace is bound to this thread")
            }
            ServiceError::Engine(EngineError::NotFound) => {
                Self::new(StatusCode::NOT_FOUND, "file_not_found", "no such file or directory")
            }
            ServiceError::NotMountable(ScopeState::Deleting) | ServiceError::Engine(EngineError::ReadOnly) => {
                Self::new(StatusCode::CONFLICT, "scope_deleting", "the workspace is being deleted")
            }
            _ => ApiError::from(e),
        }
    }

    /// An internal failure: logged with its detail, answered with a generic message.
    pub fn internal(code: &'static str, detail: &dyn std::fmt::Display) -> ApiError {
        tracing::error!(code, error = %detail, "request failed");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, code, "internal error; see the daemon log")
    }
}

impl From<IdError> for ApiError {
    fn from(e: IdError) -> ApiError {
        let code = match e {
            IdError::BadScopeId => "invalid_scope_id",
            IdError::BadThreadId => "invalid_thread_id",
        };
        ApiError::new(StatusCode::BAD_REQUEST, code, e.to_string())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> ApiError {
        let status = match e {
            JsonRejection::MissingJsonContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError::new(status, "invalid_json", e.body_text())
    }
}

impl From<PathError> for ApiError {
    fn from(e: PathError) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.to_string()).refusing(Some(Refusal::Path))
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.body_text())
    }
}

/// A form body (the admin page's login and logout) that does not parse.
impl From<axum::extract::rejection::FormRejection> for ApiError {
    fn from(e: axum::extract::rejection::FormRejection) -> ApiError {
        ApiError::new(e.status(), "invalid_form", e.body_text())
    }
}

impl From<MultipartRejection> for ApiError {
    fn from(e: MultipartRejection) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_multipart", e.body_text())
    }
}

impl From<MultipartError> for ApiError {
    fn from(e: MultipartError) -> ApiError {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::too_large();
        }
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_multipart", e.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(e: PathRejection) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.body_text())
    }
}

/// Signed-request failures (seed 003 §4.7): anything about authentication is 401.
impl From<SigningError> for ApiError {
    fn from(e: SigningError) -> ApiError {
        let code = match e {
            SigningError::BadJson(_) | SigningError::TooDeep => {
                return ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e.to_string())
            }
            SigningError::TooManyValues => {
                return ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.to_string())
            }
            SigningError::BadAuthContext(_) => "invalid_auth_context",
            SigningError::BadSignature => "invalid_signature",
            SigningError::OutsideWindow => "signature_expired",
            SigningError::Replayed => "nonce_replayed",
        };
        ApiError::new(StatusCode::UNAUTHORIZED, code, e.to_string())
    }
}

fn from_engine(e: &EngineError) -> ApiError {
    engine_answer(e).refusing(e.refusal())
}

fn engine_answer(e: &EngineError) -> ApiError {
    let conflict = |code| ApiError::new(StatusCode::CONFLICT, code, e.to_string());
    if e.out_of_space() {
        return ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "no_space", "local storage is full");
    }
    match e {
        EngineError::NotFound => ApiError::workspace_not_found(),
        EngineError::Exists => conflict("file_exists"),
        EngineError::NotDir => conflict("not_a_directory"),
        EngineError::IsDir => conflict("is_a_directory"),
        EngineError::NotEmpty => conflict("directory_not_empty"),
        EngineError::ReadOnly => conflict("scope_deleting"),
        EngineError::Changed => conflict("file_changed"),
        EngineError::TooManyEntries => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "too_many_entries", e.to_string())
        }
        EngineError::ListingTooLarge => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "listing_too_large", e.to_string())
        }
        EngineError::Busy(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", e.to_string()),
        EngineError::ScopeBusy(_) => ApiError::new(StatusCode::TOO_MANY_REQUESTS, "scope_busy", e.to_string()),
        EngineError::NameTooLong | EngineError::PathTooLong | EngineError::InvalidName(_) => {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.to_string())
        }
        EngineError::Invalid(_) | EngineError::BadSymlinkTarget => {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.to_string())
        }
        EngineError::NotPermitted(_) => ApiError::new(StatusCode::FORBIDDEN, "not_permitted", e.to_string()),
        EngineError::TooLarge => ApiError::too_large(),
        EngineError::NoSpace => ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "no_space", e.to_string()),
        EngineError::QuotaExceeded(_) => {
            ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded", e.to_string())
        }
        EngineError::Poisoned(_) => {
            tracing::error!(error = %e, "scope unavailable until its metadata is restored");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "scope_unavailable",
                "the workspace is temporarily unavailable",
            )
        }
        EngineError::Store(_) => {
            tracing::error!(error = %e, "object store failure");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "object_store_unavailable",
                "the object store is unavailable",
            )
        }
        _ => ApiError::internal("engine_error", e),
    }
}

fn from_registry(e: &RegistryError) -> ApiError {
    match e {
        RegistryError::NotFound => ApiError::new(StatusCode::NOT_FOUND, "scope_not_found", e.to_string()),
        RegistryError::Conflict { .. } if e.is_stale_revision() => {
            ApiError::new(StatusCode::CONFLICT, "revision_conflict", e.to_string())
        }
        RegistryError::Conflict { .. } => {
            ApiError::new(StatusCode::CONFLICT, "invalid_state_transition", e.to_string())
        }
        RegistryError::ThreadAlreadyBound(_) => {
            ApiError::new(StatusCode::CONFLICT, "thread_already_bound", e.to_string())
        }
        RegistryError::OperationConflict => {
            ApiError::new(StatusCode::CONFLICT, "idempotency_key_conflict", e.to_string())
        }
        RegistryError::ScopeUnavailable(state) => {
            let code = match state {
                ScopeState::Deleting => "scope_deleting",
                ScopeState::Deleted => "scope_deleted",
                _ => "scope_provisioning",
            };
            ApiError::new(StatusCode::CONFLICT, code, e.to_string())
        }
        RegistryError::CutoverInProgress(_) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "cutover-in-progress", e.to_string())
        }
        RegistryError::OwnerNotFound => ApiError::new(StatusCode::NOT_FOUND, "owner_not_found", e.to_string()),
        RegistryError::RunRequestNotFound => {
            ApiError::new(StatusCode::NOT_FOUND, "run_request_not_found", e.to_string())
        }
        RegistryError::OwnerConflict { stale_revision: true, .. } => {
            ApiError::new(StatusCode::CONFLICT, "revision_conflict", e.to_string())
        }
        RegistryError::OwnerConflict { .. } | RegistryError::RunRequestConflict { .. } => {
            ApiError::new(StatusCode::CONFLICT, "invalid_state_transition", e.to_string())
        }
        RegistryError::ResourceOwned => ApiError::new(StatusCode::CONFLICT, "resource_already_owned", e.to_string()),
        RegistryError::ResourceIdAlreadySet | RegistryError::RunIdAlreadySet => {
            ApiError::new(StatusCode::CONFLICT, "resource_id_already_set", e.to_string())
        }
        RegistryError::AmbiguousResource => ApiError::new(StatusCode::CONFLICT, "ambiguous_resource", e.to_string()),
        RegistryError::InterruptAlreadyResolved => {
            ApiError::new(StatusCode::CONFLICT, "interrupt_already_resolved", e.to_string())
        }
        RegistryError::LeaseHeld => ApiError::new(StatusCode::CONFLICT, "lease_held", e.to_string()),
        RegistryError::LeaseNotHeld => ApiError::new(StatusCode::CONFLICT, "lease_not_held", e.to_string()),
        RegistryError::NodeNotFound => ApiError::new(StatusCode::NOT_FOUND, "node_not_found", e.to_string()),
        RegistryError::NodeTransition { .. } | RegistryError::NodeHasScopes(_) => {
            ApiError::new(StatusCode::CONFLICT, "node_conflict", e.to_string())
        }
        RegistryError::Invalid { .. } => ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()),
        RegistryError::Corrupt(_)
        | RegistryError::Io(_)
        | RegistryError::Db(_)
        | RegistryError::Postgres(_)
        | RegistryError::SqliteOnly(_)
        | RegistryError::Migrate(_) => ApiError::internal("registry_error", e),
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        match &e {
            ServiceError::ScopeNotFound => ApiError::new(StatusCode::NOT_FOUND, "scope_not_found", e.to_string()),
            ServiceError::NotMountable(_) => ApiError::new(StatusCode::CONFLICT, "scope_not_mountable", e.to_string()),
            ServiceError::BadOperationId => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_operation_id", e.to_string())
            }
            ServiceError::StateNotRequestable => {
                ApiError::new(StatusCode::CONFLICT, "invalid_state_transition", e.to_string())
            }
            ServiceError::MigrationRequired => ApiError::new(StatusCode::CONFLICT, "migration-required", e.to_string()),
            ServiceError::Registry(r) => from_registry(r),
            ServiceError::Engine(en) => from_engine(en),
            ServiceError::Mount(_) => ApiError::internal("mount_failed", &e),
            ServiceError::ServedElsewhere => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "scope_moving", e.to_string())
            }
            ServiceError::Busy(_) => ApiError::new(StatusCode::CONFLICT, "scope_busy", e.to_string()),
        }
    }
}

impl From<crate::pools::ScopeBusy> for ApiError {
    /// Review M3: a scope over `limits.max_inflight_per_scope` requests in flight.
    fn from(e: crate::pools::ScopeBusy) -> ApiError {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "scope_busy", e.to_string())
    }
}

impl From<crate::services::compute::ComputeError> for ApiError {
    /// Compute tools (seed 003 §4.7): 503 unavailable, 404 environment/process missing (another
    /// scope's ids alike), 409 not running, 429 capacity, 400 validation.
    fn from(e: crate::services::compute::ComputeError) -> ApiError {
        use crate::services::compute::ComputeError as C;
        match e {
            C::Unavailable(detail) => {
                tracing::warn!(error = %detail, "compute unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "compute_unavailable",
                    "the sandbox executor is unavailable",
                )
            }
            C::EnvironmentNotFound => {
                ApiError::new(StatusCode::NOT_FOUND, "environment_not_found", "no such environment")
            }
            C::ProcessNotFound => ApiError::new(StatusCode::NOT_FOUND, "process_not_found", "no such process"),
            C::NotRunning => {
                ApiError::new(StatusCode::CONFLICT, "environment_not_running", "the environment is not running")
            }
            C::AtCapacity | C::TooMany(_) => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "compute_capacity_exceeded", e.to_string())
            }
            C::Invalid(..) => ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()),
            C::Forbidden(code, text) => ApiError::new(StatusCode::FORBIDDEN, code, text),
            C::OutputsTooLarge(text) => ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "artifact_limit", text),
            C::Service(s) => ApiError::tools(s),
            C::Executor(_) => ApiError::internal("executor_error", &e),
            C::Io(_) => ApiError::internal("runtime_area_error", &e),
            C::Billing(b) => ApiError::from(b),
        }
    }
}

impl From<scopefs::billing::BillingError> for ApiError {
    /// Billing (SPEC §9): preflight refusal is 429 `compute_quota_exceeded`.
    fn from(e: scopefs::billing::BillingError) -> ApiError {
        use scopefs::billing::BillingError as B;
        let (status, code) = match &e {
            B::ComputeQuotaExceeded(_) => (StatusCode::TOO_MANY_REQUESTS, "compute_quota_exceeded"),
            B::InsufficientComputeBalance { .. } => (StatusCode::PAYMENT_REQUIRED, "insufficient_compute_balance"),
            B::ArtifactsPending => (StatusCode::CONFLICT, "artifacts_pending"),
            B::UsageNotFound => (StatusCode::NOT_FOUND, "usage_not_found"),
            B::AccountNotFound => (StatusCode::NOT_FOUND, "account_not_found"),
            B::UnknownPlan(_) => (StatusCode::BAD_REQUEST, "unknown_plan"),
            B::CreditConflict => (StatusCode::CONFLICT, "idempotency_key_conflict"),
            B::Invalid { .. } => (StatusCode::BAD_REQUEST, "invalid_request"),
            B::Overflow => (StatusCode::BAD_REQUEST, "amount_out_of_range"),
            B::Registry(r) => return from_registry(r),
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    /// The one place every refusal passes: it is counted here, once per answer.
    fn into_response(self) -> Response {
        if let Some(kind) = self.refusal {
            crate::metrics::note_api_refusal(kind);
        }
        debug_assert!(ErrorCode::of(self.code).is_some(), "{} is not an ErrorCode", self.code);
        let body = ErrorBody { error: ErrorDetail { code: self.code, message: self.message } };
        let mut resp = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scopefs::ids::ScopeId;
    use scopefs::registry::ScopeState;

    fn status_code(e: impl Into<ApiError>) -> (u16, &'static str) {
        let e = e.into();
        (e.status.as_u16(), e.code)
    }

    #[test]
    fn maps_errors_to_statuses_and_codes() {
        assert_eq!(status_code(IdError::BadThreadId), (400, "invalid_thread_id"));
        assert_eq!(status_code(IdError::BadScopeId), (400, "invalid_scope_id"));
        assert_eq!(status_code(ServiceError::ScopeNotFound), (404, "scope_not_found"));
        assert_eq!(status_code(ServiceError::MigrationRequired), (409, "migration-required"));
        assert_eq!(status_code(ServiceError::NotMountable(ScopeState::Deleted)), (409, "scope_not_mountable"));
        assert_eq!(status_code(ServiceError::BadOperationId), (400, "invalid_operation_id"));
        assert_eq!(
            status_code(ServiceError::Registry(RegistryError::OperationConflict)),
            (409, "idempotency_key_conflict")
        );
        let stale = RegistryError::Conflict {
            expected_revision: 1,
            current_revision: 2,
            current_state: ScopeState::Draft,
            requested: ScopeState::Active,
        };
        assert_eq!(status_code(ServiceError::Registry(stale)), (409, "revision_conflict"));
        let refused = RegistryError::Conflict {
            expected_revision: 2,
            current_revision: 2,
            current_state: ScopeState::Draft,
            requested: ScopeState::Deleted,
        };
        assert_eq!(status_code(ServiceError::Registry(refused)), (409, "invalid_state_transition"));
        let bound = RegistryError::ThreadAlreadyBound(ScopeId::generate());
        assert_eq!(status_code(ServiceError::Registry(bound)), (409, "thread_already_bound"));
        assert_eq!(status_code(ServiceError::Engine(EngineError::NoSpace)), (507, "no_space"));
        let full = EngineError::Io(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(status_code(ServiceError::Engine(full)), (507, "no_space"));
        assert_eq!(status_code(ServiceError::Engine(EngineError::Poisoned("test"))), (503, "scope_unavailable"));
        let store = EngineError::Store(scopefs::store::StoreError::Unavailable("down".into()));
        assert_eq!(status_code(ServiceError::Engine(store)), (503, "object_store_unavailable"));
    }

    #[test]
    fn workspace_failures_map_to_the_statuses_of_spec_7_2() {
        let ws = |e: ServiceError| {
            let e = ApiError::workspace(e);
            (e.status.as_u16(), e.code, e.message)
        };
        // Unknown thread and missing file: the very same answer.
        assert_eq!(ws(ServiceError::ScopeNotFound), ws(ServiceError::Engine(EngineError::NotFound)));
        assert_eq!(ws(ServiceError::ScopeNotFound).0, 404);
        assert_eq!(ws(ServiceError::NotMountable(ScopeState::Deleting)).1, "scope_deleting");
        assert_eq!(ws(ServiceError::Engine(EngineError::ReadOnly)).0, 409);
        assert_eq!(ws(ServiceError::Engine(EngineError::TooLarge)).0, 413);
        assert_eq!(ws(ServiceError::Engine(EngineError::QuotaExceeded("bytes"))).1, "quota_exceeded");
        assert_eq!(ws(ServiceError::Engine(EngineError::QuotaExceeded("bytes"))).0, 507);
        assert_eq!(ws(ServiceError::Engine(EngineError::Exists)).1, "file_exists");
        assert_eq!(ws(ServiceError::Engine(EngineError::IsDir)).0, 409);
        assert_eq!(status_code(PathError::Traversal), (400, "invalid_path"));
        assert_eq!(status_code(PathError::Absolute), (400, "invalid_path"));
    }

    #[test]
    fn maps_registry_lifecycle_errors() {
        let reg = |e: RegistryError| status_code(ServiceError::Registry(e));
        assert_eq!(reg(RegistryError::CutoverInProgress("workspace-cutover".into())), (503, "cutover-in-progress"));
        assert_eq!(reg(RegistryError::ScopeUnavailable(ScopeState::Deleting)), (409, "scope_deleting"));
        assert_eq!(reg(RegistryError::ScopeUnavailable(ScopeState::Deleted)), (409, "scope_deleted"));
        assert_eq!(reg(RegistryError::InterruptAlreadyResolved), (409, "interrupt_already_resolved"));
        assert_eq!(reg(RegistryError::ResourceOwned), (409, "resource_already_owned"));
        assert_eq!(reg(RegistryError::OwnerNotFound), (404, "owner_not_found"));
        assert_eq!(reg(RegistryError::RunRequestNotFound), (404, "run_request_not_found"));
        assert_eq!(reg(RegistryError::LeaseHeld), (409, "lease_held"));
        assert_eq!(reg(RegistryError::LeaseNotHeld), (409, "lease_not_held"));
        assert_eq!(reg(RegistryError::Invalid { field: "turn_id", reason: "bad" }), (400, "invalid_request"));
        assert_eq!(status_code(ServiceError::StateNotRequestable), (409, "invalid_state_transition"));
    }

    #[test]
    fn maps_signing_and_tool_errors() {
        assert_eq!(status_code(SigningError::BadSignature), (401, "invalid_signature"));
        assert_eq!(status_code(SigningError::OutsideWindow), (401, "signature_expired"));
        assert_eq!(status_code(SigningError::Replayed), (401, "nonce_replayed"));
        assert_eq!(status_code(SigningError::BadAuthContext("x")), (401, "invalid_auth_context"));
        assert_eq!(status_code(SigningError::BadJson("x")), (400, "invalid_json"));
        assert_eq!(status_code(SigningError::TooDeep), (400, "invalid_json"));
        assert_eq!(status_code(SigningError::TooManyValues), (413, "too_large"));
        let tools = |e: ServiceError| {
            let e = ApiError::tools(e);
            (e.status.as_u16(), e.code)
        };
        assert_eq!(tools(ServiceError::ScopeNotFound), (404, "scope_not_found"));
        assert_eq!(tools(ServiceError::Engine(EngineError::NotFound)), (404, "file_not_found"));
        assert_eq!(tools(ServiceError::NotMountable(ScopeState::Deleting)), (409, "scope_deleting"));
        assert_eq!(tools(ServiceError::Engine(EngineError::QuotaExceeded("bytes"))), (507, "quota_exceeded"));
        assert_eq!(tools(ServiceError::Engine(EngineError::TooLarge)), (413, "too_large"));
        assert_eq!(tools(ServiceError::Engine(EngineError::Changed)), (409, "file_changed"));
    }

    #[test]
    fn maps_billing_errors() {
        use scopefs::billing::BillingError as B;
        assert_eq!(status_code(B::ComputeQuotaExceeded("x".into())), (429, "compute_quota_exceeded"));
        assert_eq!(status_code(B::AccountNotFound), (404, "account_not_found"));
        assert_eq!(status_code(B::UnknownPlan("x".into())), (400, "unknown_plan"));
        assert_eq!(status_code(B::CreditConflict), (409, "idempotency_key_conflict"));
        assert_eq!(status_code(B::Registry(RegistryError::Corrupt("x".into()))).0, 500);
    }

    /// Refusals are marked where they are mapped and counted only when answered (`into_response`).
    #[test]
    fn path_and_symlink_refusals_are_marked_for_counting() {
        assert_eq!(ApiError::from(PathError::Traversal).refusal, Some(Refusal::Path));
        let symlink = ServiceError::Engine(EngineError::BadSymlinkTarget);
        assert_eq!(ApiError::tools(symlink).refusal, Some(Refusal::Symlink));
        let reserved = ServiceError::Engine(EngineError::InvalidName("reserved"));
        assert_eq!(ApiError::workspace(reserved).refusal, Some(Refusal::Path));
        for other in [ServiceError::Engine(EngineError::NotFound), ServiceError::Engine(EngineError::TooLarge)] {
            assert_eq!(ApiError::from(other).refusal, None);
        }
        assert_eq!(ApiError::from(IdError::BadThreadId).refusal, None);
    }

    #[test]
    fn internal_errors_hide_their_detail() {
        let e = ApiError::from(ServiceError::Registry(RegistryError::Corrupt("secret detail".into())));
        assert_eq!((e.status.as_u16(), e.code), (500, "registry_error"));
        assert!(!e.message.contains("secret detail"));
    }
}
