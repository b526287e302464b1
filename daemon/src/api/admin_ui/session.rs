//! Sessions of the admin page (`/admin/ui`): the login form's check of the admin token, the
//! session table (random ids, expiry, a bound), the session cookie, each session's CSRF token,
//! logout, and the middleware of the `Auth::AdminSession` routes.
//!
//! Security decisions:
//! - The admin token is posted in the login form's body (never in a URL) and compared in constant
//!   time by [`Token::matches`], the same check as `X-Admin-Token`.
//! - A session id is 256 bits from the thread-local CSPRNG (`rand`), given to the browser only in
//!   the cookie; the table keys sessions by the id's SHA-256, so it holds no id and a lookup's
//!   timing says nothing about one. A session ends [`SESSION_TTL`] after login or at logout; at
//!   most [`MAX_SESSIONS`] live at once (checked before a new one is made: 429 past it).
//! - The cookie is `HttpOnly; SameSite=Strict; Path=/admin/ui`. It is not `Secure`: the daemon
//!   serves plain HTTP (usually on loopback), where a `Secure` cookie would never be sent back.
//! - Every form posted with a session (logout) carries the session's CSRF token, compared in
//!   constant time. The login form itself has no session yet: a cross-site login post is refused
//!   by `Sec-Fetch-Site` (anything but `same-origin`/`none`) or, without it, by an `Origin` that
//!   is not this host (a client that sends neither is not a browser and holds no ambient cookie).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use cookie::{Cookie, SameSite};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::api::{ApiError, AppState};
use crate::tokens::Token;

/// The session cookie's name.
pub const COOKIE: &str = "scopefs_admin_session";
/// Sessions that may be live at once; a login past it is refused until one ends or expires.
pub const MAX_SESSIONS: usize = 32;
/// How long a session lasts after its login.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// Longest admin token the login form takes (longer is a wrong token, not hashed).
pub const MAX_TOKEN_BYTES: usize = 1024;
/// Where the cookie is sent back.
pub const PATH: &str = "/admin/ui";
/// The login form.
pub const LOGIN: &str = "/admin/ui/login";

/// One live session.
struct Session {
    csrf: Token,
    expires: Instant,
}

/// The live sessions of the admin page (in memory: a restart logs everyone out).
#[derive(Default)]
pub struct Sessions {
    live: Mutex<HashMap<[u8; 32], Session>>,
}

/// The session of a request, as the middleware found it (a request extension).
#[derive(Clone)]
pub struct SessionInfo {
    key: [u8; 32],
    /// The session's CSRF token, for the forms a page renders.
    pub csrf: String,
}

fn key_of(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

impl Sessions {
    /// A new session: its id (for the cookie only). Expired sessions are dropped first; past
    /// [`MAX_SESSIONS`] live ones it is refused.
    pub fn create(&self) -> Result<String, ApiError> {
        let now = Instant::now();
        let mut live = self.live.lock();
        live.retain(|_, s| s.expires > now);
        if live.len() >= MAX_SESSIONS {
            return Err(ApiError::admin_sessions_full());
        }
        let id = random_hex();
        live.insert(key_of(&id), Session { csrf: Token::new(random_hex()), expires: now + SESSION_TTL });
        Ok(id)
    }

    /// The live session of `id`, if any (an expired one is dropped).
    fn find(&self, id: &str) -> Option<SessionInfo> {
        let key = key_of(id);
        let mut live = self.live.lock();
        match live.get(&key) {
            Some(s) if s.expires > Instant::now() => Some(SessionInfo { key, csrf: s.csrf.expose().to_owned() }),
            Some(_) => {
                live.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Whether `presented` is the CSRF token of `session` (constant-time compare).
    pub fn csrf_ok(&self, session: &SessionInfo, presented: &str) -> bool {
        self.live.lock().get(&session.key).is_some_and(|s| s.csrf.matches(presented))
    }

    /// Ends `session`.
    pub fn end(&self, session: &SessionInfo) {
        self.live.lock().remove(&session.key);
    }

    /// Live sessions now.
    #[cfg(test)]
    fn count(&self) -> usize {
        let now = Instant::now();
        self.live.lock().values().filter(|s| s.expires > now).count()
    }
}

/// The session cookie's value in `headers`, if sent.
fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == COOKIE)
        .map(|c| c.value().to_owned())
}

/// The session `headers` carry, if live.
pub fn session_of(sessions: &Sessions, headers: &HeaderMap) -> Option<SessionInfo> {
    cookie_value(headers).and_then(|id| sessions.find(&id))
}

/// The `Set-Cookie` of a session (`Some(id)`), or the one that clears it (`None`).
pub fn set_cookie(id: Option<&str>) -> HeaderValue {
    // Not `Secure`: the daemon may serve plain HTTP on loopback, where browsers would drop it.
    let mut c = Cookie::build((COOKIE, id.unwrap_or("").to_owned()))
        .path(PATH)
        .http_only(true)
        .same_site(SameSite::Strict)
        .max_age(cookie::time::Duration::seconds(SESSION_TTL.as_secs() as i64))
        .build();
    if id.is_none() {
        c.set_max_age(cookie::time::Duration::ZERO);
    }
    // Hex ids and fixed attributes only: always a valid header value.
    HeaderValue::from_str(&c.to_string()).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Whether a login post comes from this host's page (see the module docs).
pub fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site")) {
        return site == "same-origin" || site == "none";
    }
    match (text(header::ORIGIN), text(header::HOST)) {
        (None, _) => true,
        (Some(origin), Some(host)) => origin == format!("http://{host}") || origin == format!("https://{host}"),
        (Some(_), None) => false,
    }
}

/// The admin token posted by the login form matches (constant time; an over-long one never does).
pub fn token_ok(st: &AppState, presented: &str) -> bool {
    presented.len() <= MAX_TOKEN_BYTES && st.admin_token.matches(presented.trim())
}

/// The middleware of `Auth::AdminSession` routes: without a live session, a redirect (303) to the
/// login form; with one, its [`SessionInfo`] for the handler.
pub async fn require_session(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    match session_of(&st.admin_sessions, req.headers()) {
        Some(info) => {
            req.extensions_mut().insert(info);
            next.run(req).await
        }
        None => Redirect::to(LOGIN).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_bounded_found_by_id_and_end() {
        let s = Sessions::default();
        let ids: Vec<String> = (0..MAX_SESSIONS).map(|_| s.create().unwrap()).collect();
        assert_eq!(s.create().unwrap_err().code, "admin_sessions_full");
        assert!(ids.iter().all(|id| id.len() == 64), "256-bit hex ids");
        let info = s.find(&ids[0]).expect("live");
        assert!(s.csrf_ok(&info, &info.csrf.clone()));
        assert!(!s.csrf_ok(&info, "forged"));
        assert!(s.find("not-an-id").is_none());
        s.end(&info);
        assert!(s.find(&ids[0]).is_none());
        assert_eq!(s.count(), MAX_SESSIONS - 1);
        s.create().expect("room again after a logout");
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_scoped_to_the_page() {
        let v = set_cookie(Some("abc")).to_str().unwrap().to_owned();
        for part in ["scopefs_admin_session=abc", "HttpOnly", "SameSite=Strict", "Path=/admin/ui"] {
            assert!(v.contains(part), "{v} lacks {part}");
        }
        assert!(!v.contains("Secure"), "{v}");
        assert!(set_cookie(None).to_str().unwrap().contains("Max-Age=0"));
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_static("a=1; scopefs_admin_session=xyz; b=2"));
        assert_eq!(cookie_value(&h).as_deref(), Some("xyz"));
    }

    #[test]
    fn cross_site_login_posts_are_refused() {
        let mut h = HeaderMap::new();
        assert!(same_origin(&h), "no browser headers: not a browser");
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        h.insert(header::ORIGIN, HeaderValue::from_static("http://evil.example"));
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("http://127.0.0.1:8080"));
        assert!(same_origin(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(!same_origin(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(same_origin(&h));
    }
}
