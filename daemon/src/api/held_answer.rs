//! Answers kept in memory until the client has taken them, with what they are charged to (a
//! `/tools` body-budget charge, a listing's charge) held as long: a client that reads slowly, or
//! not at all, holds its charge instead of memory no budget counts.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use serde::Serialize;

use super::ApiError;

/// Bytes of an answer handed to the connection at a time.
const ANSWER_CHUNK: usize = 256 * 1024;

/// A JSON answer and the charge it is held under (dropped with the answer's last bytes).
pub struct HeldAnswer {
    bytes: Bytes,
    held: Box<dyn Send>,
}

impl HeldAnswer {
    /// `bytes` (a JSON document) held under `held` until sent.
    pub fn new(bytes: Vec<u8>, held: impl Send + 'static) -> HeldAnswer {
        HeldAnswer { bytes: Bytes::from(bytes), held: Box::new(held) }
    }

    /// `value` as JSON, held under `held` until sent.
    pub fn json<T: Serialize>(value: &T, held: impl Send + 'static) -> Result<HeldAnswer, ApiError> {
        let bytes = serde_json::to_vec(value).map_err(|e| ApiError::internal("answer_not_serialized", &e))?;
        Ok(HeldAnswer::new(bytes, held))
    }
}

impl IntoResponse for HeldAnswer {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::new(HeldBody { rest: self.bytes, _held: self.held }));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}

/// The body of a [`HeldAnswer`]: handed out a chunk at a time as the connection asks for it.
struct HeldBody {
    rest: Bytes,
    _held: Box<dyn Send>,
}

impl http_body::Body for HeldBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.rest.is_empty() {
            return Poll::Ready(None);
        }
        let n = self.rest.len().min(ANSWER_CHUNK);
        Poll::Ready(Some(Ok(Frame::data(self.rest.split_to(n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use http_body_util::BodyExt;

    use super::*;

    /// Set when dropped.
    struct Flag(Arc<AtomicBool>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn the_charge_is_held_until_the_last_chunk_is_taken() {
        let dropped = Arc::new(AtomicBool::new(false));
        let value = serde_json::json!({ "content": "x".repeat(ANSWER_CHUNK * 2 + 10) });
        let answer = HeldAnswer::json(&value, Flag(dropped.clone())).unwrap().into_response();
        let mut body = answer.into_body();
        let mut taken = Vec::new();
        while let Some(frame) = body.frame().await {
            assert!(!dropped.load(Ordering::SeqCst), "held while chunks remain");
            taken.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&taken).unwrap(), value);
        drop(body);
        assert!(dropped.load(Ordering::SeqCst), "given back with the answer");
    }
}
