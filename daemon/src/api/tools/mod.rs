//! `/tools/*`: the HMAC-signed execution API of the agent runtime (SPEC §7.3, seed 003 §4).

pub mod auth;
mod base64;
mod compute;
mod files;
mod search;

#[allow(unused_imports)] // For the compute tools.
pub use auth::SignedRequest;
pub use auth::ToolsAuth;

use super::routes::RouteTable;
use super::AppState;

/// Adds every `/tools/*` route to the table.
pub fn add_routes(table: RouteTable<AppState>) -> RouteTable<AppState> {
    table.merge_from(files::add_routes).merge_from(compute::add_routes)
}
