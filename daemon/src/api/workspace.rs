//! `/api/workspace*`: the WebUI's workspace file routes (SPEC §7.2).

use super::routes::RouteTable;
use super::AppState;

/// Adds the workspace file routes to the table.
pub fn add_routes(table: RouteTable<AppState>) -> RouteTable<AppState> {
    table
}
