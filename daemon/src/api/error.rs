//! `ApiError`: the one place where failures become HTTP statuses and `{"error":{"code","message"}}` bodies.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use scopefs::engine::EngineError;
use scopefs::ids::IdError;
use scopefs::registry::RegistryError;

use crate::service::ServiceError;

/// An HTTP error answer. 5xx details are logged, never returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into() }
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

impl From<PathRejection> for ApiError {
    fn from(e: PathRejection) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.body_text())
    }
}

fn from_engine(e: &EngineError) -> ApiError {
    match e {
        EngineError::NoSpace => ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "no_space", e.to_string()),
        EngineError::QuotaExceeded(_) => {
            ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded", e.to_string())
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
        RegistryError::Corrupt(_) | RegistryError::Io(_) | RegistryError::Sqlite(_) | RegistryError::Migrate(_) => {
            ApiError::internal("registry_error", e)
        }
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
            ServiceError::Registry(r) => from_registry(r),
            ServiceError::Engine(en) => from_engine(en),
            ServiceError::Mount(_) => ApiError::internal("mount_failed", &e),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
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
        let store = EngineError::Store(scopefs::store::StoreError::Unavailable("down".into()));
        assert_eq!(status_code(ServiceError::Engine(store)), (503, "object_store_unavailable"));
    }

    #[test]
    fn internal_errors_hide_their_detail() {
        let e = ApiError::from(ServiceError::Registry(RegistryError::Corrupt("secret detail".into())));
        assert_eq!((e.status.as_u16(), e.code), (500, "registry_error"));
        assert!(!e.message.contains("secret detail"));
    }
}
