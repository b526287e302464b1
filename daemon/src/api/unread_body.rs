//! Reads and discards what a handler left unread of a request body before its answer goes out, so a
//! client still sending (an upload refused with 413, 401 or 409) reads the answer instead of a reset.
//!
//! A server that answers early and closes with request bytes still unread makes the kernel reset
//! the connection, and a client still writing its body then loses the answer. Like a web server's
//! lingering close, the rest of the body is read and thrown away — at most [`DRAIN_LIMIT_BYTES`]
//! for at most [`DRAIN_LIMIT_TIME`]. A body too large for that (its declared length says so, or the
//! budget runs out) is not read: the answer then carries `Connection: close`, so no client reuses
//! the connection with a half-sent body on it. An unauthenticated request (401) is not drained —
//! nobody without a token makes the daemon read for them — and is left to hyper's own handling.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};

/// At most this many unread body bytes are read and discarded after a handler has answered.
pub const DRAIN_LIMIT_BYTES: u64 = 64 * 1024 * 1024;
/// ... and for at most this long.
pub const DRAIN_LIMIT_TIME: Duration = Duration::from_secs(10);

/// The request body and how many data bytes the handler read of it.
struct Tracked {
    body: Body,
    consumed: u64,
}

/// The body the handler sees: the real one, shared with the middleware that drains it afterwards.
struct SharedBody(Arc<Mutex<Tracked>>);

fn lock(shared: &Mutex<Tracked>) -> MutexGuard<'_, Tracked> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl HttpBody for SharedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let mut tracked = lock(&self.0);
        let polled = Pin::new(&mut tracked.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                tracked.consumed += data.len() as u64;
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        lock(&self.0).body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        lock(&self.0).body.size_hint()
    }
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// Middleware: runs the handler, then drains the unread rest of the body within the limits, or
/// marks the answer `Connection: close` when that rest is not read to its end.
pub async fn drain_unread_body(req: Request, next: Next) -> Response {
    let declared = declared_length(req.headers());
    let (parts, body) = req.into_parts();
    let shared = Arc::new(Mutex::new(Tracked { body, consumed: 0 }));
    let req = Request::from_parts(parts, Body::new(SharedBody(shared.clone())));
    let mut response = next.run(req).await;
    let (mut rest, consumed) = {
        let mut tracked = lock(&shared);
        (std::mem::replace(&mut tracked.body, Body::empty()), tracked.consumed)
    };
    if rest.is_end_stream() || response.status() == StatusCode::UNAUTHORIZED {
        return response;
    }
    let too_much_left = declared.is_some_and(|n| n.saturating_sub(consumed) > DRAIN_LIMIT_BYTES);
    let drained = !too_much_left && matches!(tokio::time::timeout(DRAIN_LIMIT_TIME, drain(&mut rest)).await, Ok(true));
    if !drained {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Reads `body` to its end, discarding it; false when it fails or exceeds [`DRAIN_LIMIT_BYTES`].
async fn drain(body: &mut Body) -> bool {
    let mut left = DRAIN_LIMIT_BYTES;
    loop {
        match std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
            None => return true,
            Some(Err(_)) => return false,
            Some(Ok(frame)) => {
                let len = frame.data_ref().map_or(0, |d| d.len() as u64);
                match left.checked_sub(len) {
                    Some(l) => left = l,
                    None => return false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::put;
    use axum::Router;
    use futures_util::stream;
    use tower::ServiceExt;

    /// A handler that reads the first chunk of the body, then answers 413 without reading the rest.
    async fn reads_prefix(req: Request) -> StatusCode {
        let mut body = req.into_body();
        let mut seen = 0;
        while seen < 4 {
            match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                Some(Ok(f)) => seen += f.data_ref().map_or(0, |d| d.len()),
                _ => break,
            }
        }
        StatusCode::PAYLOAD_TOO_LARGE
    }

    fn app() -> Router {
        Router::new()
            .route("/", put(reads_prefix))
            .route("/locked", put(|| async { StatusCode::UNAUTHORIZED }))
            .layer(axum::middleware::from_fn(drain_unread_body))
    }

    /// PUTs a streamed body of 100 chunks of 1 KiB (with `declared` as its Content-Length, if any)
    /// to `path`; returns the answer and how many chunks were taken from the body.
    async fn put_counted(path: &str, declared: Option<u64>) -> (Response, usize) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let taken = Arc::new(AtomicUsize::new(0));
        let counter = taken.clone();
        let chunks = stream::iter((0..100).map(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Bytes::from(vec![0u8; 1024]))
        }));
        let mut req = Request::put(path);
        if let Some(n) = declared {
            req = req.header(header::CONTENT_LENGTH, n.to_string());
        }
        let resp = app().oneshot(req.body(Body::from_stream(chunks)).unwrap()).await.unwrap();
        (resp, taken.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn the_unread_rest_is_drained_and_the_connection_kept() {
        let (resp, taken) = put_counted("/", None).await;
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(taken, 100, "every chunk was read");
        assert!(resp.headers().get(header::CONNECTION).is_none());
    }

    #[tokio::test]
    async fn a_declared_length_beyond_the_budget_is_not_read_and_closes_the_connection() {
        let (resp, taken) = put_counted("/", Some(DRAIN_LIMIT_BYTES + 10_000)).await;
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert!(taken < 100, "the rest was not read");
        assert_eq!(resp.headers().get(header::CONNECTION).unwrap(), "close");
    }

    #[tokio::test]
    async fn an_unauthenticated_body_is_not_read() {
        let (resp, taken) = put_counted("/locked", None).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(taken, 0, "nothing was read");
    }

    #[tokio::test]
    async fn a_body_that_breaks_off_closes_the_connection() {
        let s =
            stream::iter(vec![Ok(Bytes::from_static(b"0123456789")), Err(std::io::Error::other("client went away"))]);
        let req = Request::put("/").body(Body::from_stream(s)).unwrap();
        let resp = app().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(resp.headers().get(header::CONNECTION).unwrap(), "close");
    }
}
