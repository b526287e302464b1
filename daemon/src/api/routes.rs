//! The route table: every route with its method, path, authentication class and summary. One table
//! builds the router, the OpenAPI document and the list the authentication tests walk.

use axum::routing::MethodRouter;
use axum::Router;

pub use super::openapi::{openapi, Doc};

/// Who may call a route (SPEC §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// `/health`, `/ready`, `/openapi.json`.
    Public,
    /// `Authorization: Bearer <service token>`: `/internal/*`, `/api/*`, `/metrics`.
    Service,
    /// `X-Admin-Token`: `/admin/*`.
    Admin,
    /// HMAC-signed `auth_context` in the body: `/tools/*`.
    Signed,
    /// A session cookie of the admin page, got by posting the admin token to its login form:
    /// `/admin/ui/*` (see `api::admin_ui::session`).
    AdminSession,
}

impl Auth {
    pub fn as_str(self) -> &'static str {
        match self {
            Auth::Public => "public",
            Auth::Service => "service_token",
            Auth::Admin => "admin_token",
            Auth::Signed => "hmac_auth_context",
            Auth::AdminSession => "admin_session",
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone)]
pub struct RouteSpec {
    pub method: &'static str,
    /// axum/OpenAPI path template, e.g. `/internal/workspace-scopes/{scope_id}/mount`.
    pub path: &'static str,
    pub auth: Auth,
    pub summary: &'static str,
    /// Body, answers and errors for the OpenAPI document (`RouteTable::doc`); `None`: not yet.
    pub doc: Option<Doc>,
}

/// Collects routes per authentication class; `build` applies each class's layer.
pub struct RouteTable<S> {
    groups: Vec<(Auth, Router<S>)>,
    pub specs: Vec<RouteSpec>,
}

impl<S: Clone + Send + Sync + 'static> RouteTable<S> {
    pub fn new() -> Self {
        let groups = [Auth::Public, Auth::Service, Auth::Admin, Auth::Signed, Auth::AdminSession]
            .map(|a| (a, Router::new()))
            .to_vec();
        RouteTable { groups, specs: Vec::new() }
    }

    /// Adds one method of one path. `handler` must serve exactly `method`.
    pub fn add(
        mut self,
        method: &'static str,
        path: &'static str,
        auth: Auth,
        summary: &'static str,
        handler: MethodRouter<S>,
    ) -> Self {
        let group = self.groups.iter_mut().find(|(a, _)| *a == auth).map(|(_, r)| r).expect("every class has a group");
        *group = std::mem::take(group).route(path, handler);
        self.specs.push(RouteSpec { method, path, auth, summary, doc: None });
        self
    }

    /// Documents the row just added: `.add(...).doc(Doc::new().body::<B>().ok::<A>(200))`.
    pub fn doc(mut self, doc: Doc) -> Self {
        if let Some(last) = self.specs.last_mut() {
            last.doc = Some(doc);
        }
        self
    }

    /// Lets a module add its rows: `table.merge_from(workspace::add_routes)`.
    pub fn merge_from(self, add: impl FnOnce(Self) -> Self) -> Self {
        add(self)
    }

    /// The routers of each class, for the caller to layer and merge.
    pub fn into_groups(self) -> (Vec<(Auth, Router<S>)>, Vec<RouteSpec>) {
        (self.groups, self.specs)
    }
}

impl<S: Clone + Send + Sync + 'static> Default for RouteTable<S> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;

    #[test]
    fn openapi_lists_every_method_of_every_path_with_its_parameters() {
        let t: RouteTable<()> = RouteTable::new()
            .add("GET", "/a/{id}", Auth::Service, "read", get(|| async {}))
            .add("PUT", "/a/{id}", Auth::Service, "write", axum::routing::put(|| async {}))
            .add("GET", "/health", Auth::Public, "live", get(|| async {}));
        let doc = openapi(&t.specs);
        assert_eq!(doc["paths"]["/a/{id}"]["get"]["summary"], "read");
        assert_eq!(doc["paths"]["/a/{id}"]["put"]["parameters"][0]["name"], "id");
        assert!(doc["paths"]["/health"]["get"].get("security").is_none());
        assert_eq!(doc["paths"].as_object().unwrap().len(), 2);
    }
}
