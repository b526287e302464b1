//! Extractors that reject with [`ApiError`] (axum's customize-extractor-error pattern): handlers
//! take `ApiJson(x)`, `ApiQuery(q)`, `ApiPath(p)`, and [`ScopePath`] for `{scope_id}` routes.
//!
//! Each wraps axum's own extractor and converts its rejection with the `From` impls of
//! `api::error` (400 `invalid_json` / 415, 400 `invalid_query`, 400 `invalid_path`).

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::Json;
use scopefs::ids::ScopeId;
use serde::de::DeserializeOwned;

use super::ApiError;

/// A JSON body (`axum::Json`) whose rejection is an [`ApiError`].
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let Json(value) = Json::<T>::from_request(req, state).await?;
        Ok(ApiJson(value))
    }
}

/// A query string (`axum::extract::Query`) whose rejection is an [`ApiError`].
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Query(value) = Query::<T>::from_request_parts(parts, state).await?;
        Ok(ApiQuery(value))
    }
}

/// Path parameters (`axum::extract::Path`) whose rejection is an [`ApiError`].
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(value) = Path::<T>::from_request_parts(parts, state).await?;
        Ok(ApiPath(value))
    }
}

/// The `{scope_id}` of a route, validated when the request is extracted (before its body is read:
/// 400 `invalid_scope_id` wins over a bad body), and the route's other parameter: `T = ()` for
/// `…/{scope_id}`, `T = String` for `…/{scope_id}/…/{id}`.
pub struct ScopePath<T = ()>(pub ScopeId, pub T);

impl<S: Send + Sync> FromRequestParts<S> for ScopePath<()> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let ApiPath(scope) = ApiPath::<String>::from_request_parts(parts, state).await?;
        Ok(ScopePath(ScopeId::parse(&scope)?, ()))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ScopePath<String> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let ApiPath((scope, rest)) = ApiPath::<(String, String)>::from_request_parts(parts, state).await?;
        Ok(ScopePath(ScopeId::parse(&scope)?, rest))
    }
}
