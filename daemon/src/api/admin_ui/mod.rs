//! The admin page at `/admin/ui` (issue 25, item 5): its rows of the route table, thin handlers
//! that gather a view (`data`, on the internal pool) and render it (`pages`), and the headers every
//! page carries (a `Content-Security-Policy` that allows only this origin's stylesheet and forms).
//! Sessions, the login and CSRF checks are in `session`.

mod data;
mod pages;
pub mod session;

use axum::extract::rejection::FormRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Form};
use maud::Markup;
use scopefs::ids::ScopeId;
use serde::Deserialize;

use session::SessionInfo;
pub use session::{require_session, Sessions};

use super::extract::{ApiPath, ApiQuery};
use super::openapi::Doc;
use super::routes::{Auth, RouteTable};
use super::{blocking, ApiError, AppState};
use crate::pools::RouteClass::Internal;

/// Most bytes of a login or logout form body.
const MAX_FORM_BYTES: usize = 8 * 1024;

/// Only this origin's stylesheet and forms; no script, frame, font or image from anywhere.
const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// Adds the `/admin/ui` routes to the table.
pub fn add_routes(table: RouteTable<AppState>) -> RouteTable<AppState> {
    use crate::api::error::ErrorCode as E;
    let form_limit = || DefaultBodyLimit::max(MAX_FORM_BYTES);
    const FORM: &str = "application/x-www-form-urlencoded";
    // A page: HTML, or without a session a 303 to the login form; a failure is an HTML page too.
    let page = |codes: &[E]| Doc::new().ok_media(200, "text/html").ok_empty(303).html_page(codes);
    table
        .add("GET", "/admin/ui/login", Auth::Public, "Admin page: the login form (HTML)", get(login_form))
        .doc(page(&[]))
        .add(
            "POST",
            "/admin/ui/login",
            Auth::Public,
            "Admin page: log in with the admin token (form body token=...); sets the session cookie \
             (HttpOnly, SameSite=Strict) and redirects to /admin/ui; a cross-site post is 403 csrf_refused",
            post(login).layer(form_limit()),
        )
        .doc(Doc::new().body_media(FORM).ok_empty(303).html_page(&[
            E::Unauthorized,
            E::CsrfRefused,
            E::AdminSessionsFull,
            E::InvalidForm,
        ]))
        .add("GET", "/admin/ui/style.css", Auth::Public, "Admin page: its stylesheet", get(style))
        .doc(Doc::new().ok_media(200, "text/css"))
        .add(
            "POST",
            "/admin/ui/logout",
            Auth::AdminSession,
            "Admin page: end the session (form body csrf=<the session's CSRF token>; without it 403 csrf_refused)",
            post(logout).layer(form_limit()),
        )
        .doc(Doc::new().body_media(FORM).ok_empty(303).html_page(&[E::CsrfRefused]))
        .add("GET", "/admin/ui", Auth::AdminSession, "Admin page: scopes by state, usage, quota, node", get(scopes))
        .doc(page(&[E::TaskFailed]))
        .add(
            "GET",
            "/admin/ui/scopes/{scope_id}",
            Auth::AdminSession,
            "Admin page: one scope's files (query path=<directory>) and environments",
            get(scope),
        )
        .doc(page(&[E::InvalidScopeId, E::InvalidPath, E::NotFound, E::ScopeNotFound, E::TaskFailed]).param(
            "path",
            false,
            "the directory to list (default: the root)",
        ))
        .add(
            "GET",
            "/admin/ui/environments",
            Auth::AdminSession,
            "Admin page: live environments, their processes, runtime and cost so far",
            get(environments),
        )
        .doc(page(&[E::TaskFailed]))
        .add("GET", "/admin/ui/accounts", Auth::AdminSession, "Admin page: accounts and balances", get(accounts))
        .doc(page(&[E::TaskFailed]))
        .add(
            "GET",
            "/admin/ui/accounts/{user_id}",
            Auth::AdminSession,
            "Admin page: one account and its ledger",
            get(account),
        )
        .doc(page(&[E::InvalidUserId, E::AccountNotFound, E::TaskFailed]))
        .add(
            "GET",
            "/admin/ui/usage",
            Auth::AdminSession,
            "Admin page: pending and settled usage with artifacts",
            get(usage),
        )
        .doc(page(&[E::TaskFailed]))
        .add("GET", "/admin/ui/refusals", Auth::AdminSession, "Admin page: refusals by bound", get(refusals))
        .doc(page(&[]))
        .add(
            "GET",
            "/admin/ui/health",
            Auth::AdminSession,
            "Admin page: health of the store, the registry and Docker",
            get(health),
        )
        .doc(page(&[]))
}

/// The headers of every admin page answer.
fn with_page_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    resp
}

fn page(status: StatusCode, markup: Markup) -> Response {
    with_page_headers((status, Html(markup.into_string())).into_response())
}

/// An [`ApiError`] as a page, with its status (mapped in `api::error`).
fn error_page(csrf: Option<&str>, e: ApiError) -> Response {
    page(e.status, pages::error(csrf, e.code, &e.message))
}

fn render<T>(s: &SessionInfo, r: Result<T, ApiError>, f: impl FnOnce(T) -> Markup) -> Response {
    match r {
        Ok(v) => page(StatusCode::OK, f(v)),
        Err(e) => error_page(Some(&s.csrf), e),
    }
}

async fn style() -> Response {
    let resp = ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], pages::STYLE).into_response();
    with_page_headers(resp)
}

async fn login_form(State(st): State<AppState>, headers: HeaderMap) -> Response {
    if session::session_of(&st.admin_sessions, &headers).is_some() {
        return with_page_headers(Redirect::to(session::PATH).into_response());
    }
    page(StatusCode::OK, pages::login(None))
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(
    State(st): State<AppState>,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    if !session::same_origin(&headers) {
        return error_page(None, ApiError::csrf_refused());
    }
    let Form(form) = match form {
        Ok(f) => f,
        Err(e) => return error_page(None, e.into()),
    };
    if !session::token_ok(&st, &form.token) {
        let e = ApiError::admin_login_failed();
        tracing::warn!("admin page: a login with a wrong token");
        return page(e.status, pages::login(Some(&e.message)));
    }
    match st.admin_sessions.create() {
        Ok(id) => {
            let mut resp = Redirect::to(session::PATH).into_response();
            resp.headers_mut().insert(header::SET_COOKIE, session::set_cookie(Some(&id)));
            with_page_headers(resp)
        }
        Err(e) => error_page(None, e),
    }
}

#[derive(Deserialize)]
struct CsrfForm {
    csrf: Option<String>,
}

async fn logout(
    State(st): State<AppState>,
    Extension(s): Extension<SessionInfo>,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    let presented = form.ok().and_then(|Form(f)| f.csrf).unwrap_or_default();
    if !st.admin_sessions.csrf_ok(&s, &presented) {
        return error_page(Some(&s.csrf), ApiError::csrf_refused());
    }
    st.admin_sessions.end(&s);
    let mut resp = Redirect::to(session::LOGIN).into_response();
    resp.headers_mut().insert(header::SET_COOKIE, session::set_cookie(None));
    with_page_headers(resp)
}

async fn scopes(State(st): State<AppState>, Extension(s): Extension<SessionInfo>) -> Response {
    let r = blocking(Internal, move || data::scopes(&st)).await;
    render(&s, r, |v| pages::scopes(&s.csrf, &v))
}

#[derive(Deserialize)]
struct DirQuery {
    path: Option<String>,
}

async fn scope(
    State(st): State<AppState>,
    Extension(s): Extension<SessionInfo>,
    ApiPath(scope_id): ApiPath<String>,
    ApiQuery(q): ApiQuery<DirQuery>,
) -> Response {
    let parsed = ScopeId::parse(&scope_id).map_err(ApiError::from).and_then(|id| {
        let dir = scopefs::vpath::normalize_virtual_dir(q.path.as_deref().unwrap_or(""))?;
        Ok((id, format!("/{dir}")))
    });
    let (id, dir) = match parsed {
        Ok(v) => v,
        Err(e) => return error_page(Some(&s.csrf), e),
    };
    let r = blocking(Internal, move || {
        let now = st.scopes.registry().now_ms();
        data::scope(&st, &id, &dir).map(|v| (now, v))
    })
    .await;
    render(&s, r, |(now, v)| pages::scope(&s.csrf, now, &v))
}

async fn environments(State(st): State<AppState>, Extension(s): Extension<SessionInfo>) -> Response {
    let r = blocking(Internal, move || data::environments(&st)).await;
    render(&s, r, |(now, total, rows)| pages::environments(&s.csrf, now, total, &rows))
}

async fn accounts(State(st): State<AppState>, Extension(s): Extension<SessionInfo>) -> Response {
    let r = blocking(Internal, move || data::accounts(&st)).await;
    render(&s, r, |v| pages::accounts(&s.csrf, &v))
}

async fn account(
    State(st): State<AppState>,
    Extension(s): Extension<SessionInfo>,
    ApiPath(user): ApiPath<String>,
) -> Response {
    let r = blocking(Internal, move || {
        let now = st.billing.registry.now_ms();
        let found = data::account(&st, &user)?.ok_or(scopefs::billing::BillingError::AccountNotFound)?;
        Ok::<_, scopefs::billing::BillingError>((now, found))
    })
    .await;
    render(&s, r, |(now, (a, ledger))| pages::account(&s.csrf, now, &a, &ledger))
}

async fn usage(State(st): State<AppState>, Extension(s): Extension<SessionInfo>) -> Response {
    let r = blocking(Internal, move || data::usage(&st)).await;
    render(&s, r, |(pending, settled)| pages::usage(&s.csrf, &pending, &settled))
}

async fn refusals(Extension(s): Extension<SessionInfo>) -> Response {
    let r = data::refusals();
    page(StatusCode::OK, pages::refusals(&s.csrf, &r.bounds, &r.kinds))
}

async fn health(State(st): State<AppState>, Extension(s): Extension<SessionInfo>) -> Response {
    let store = data::store_check(&st).await;
    let r = blocking(Internal, move || Ok::<_, ApiError>(data::health(&st))).await;
    render(&s, r, |mut checks| {
        checks.insert(1, store);
        pages::health(&s.csrf, &checks)
    })
}
