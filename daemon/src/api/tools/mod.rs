//! `/tools/*`: the HMAC-signed execution API of the agent runtime (SPEC §7.3, seed 003 §4).

pub mod auth;
mod body_memory;
mod compute;
mod edit;
mod files;
pub mod object_scope;
mod reads;
mod search;
mod target;

pub use auth::{file_limit, SignedRequest, ToolsAuth};
use scopefs::engine::EngineError;

use super::routes::RouteTable;
use super::{ApiError, AppState};
use crate::services::ServiceError;

/// Adds every `/tools/*` route to the table.
pub fn add_routes(table: RouteTable<AppState>) -> RouteTable<AppState> {
    table.merge_from(files::add_routes).merge_from(compute::add_routes)
}

/// An engine failure of a file tool, answered as the tools answer it (`ApiError::tools`).
fn engine_err(e: EngineError) -> ApiError {
    ApiError::tools(ServiceError::Engine(e))
}
