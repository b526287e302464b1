//! `/tools/*` files routes (being written).

use super::super::routes::RouteTable;
use super::super::AppState;

pub fn add_routes(table: RouteTable<AppState>) -> RouteTable<AppState> {
    table
}
