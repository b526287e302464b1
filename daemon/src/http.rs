//! The HTTP/1.1 accept loop (review L12): at most `limits.http_max_connections` connections are
//! served at once (more wait in the listen backlog), a client must send a request's headers
//! within `limits.http_header_timeout_secs` (a slowloris connection is closed), and at shutdown
//! every connection finishes its request and closes, bounded by the caller's drain period.
//! The per-request deadline is a router layer (`api::request_deadline`). A client that takes
//! no bytes of an answer for `limits.http_send_timeout_secs` has its connection closed
//! ([`SendDeadline`]): an answer held for it gives back its memory and its budget charge.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use scopefs::limits::{self, Bound, LimitsConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// Most bytes hyper buffers for one connection in each direction (its default is about 400 KiB):
/// a request's head must fit (past it: 431), and a request body arrives in pieces of at most this.
pub const CONNECTION_BUFFER_BYTES: usize = 64 * 1024;

/// Serves `app` on `listener` until `stop` turns true, then waits for open connections to finish.
pub async fn serve(listener: TcpListener, app: Router, limits: &LimitsConfig, mut stop: watch::Receiver<bool>) {
    let max = limits.http_max_connections.clamp(1, u32::MAX as usize).min(Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(max));
    let header_timeout = Duration::from_secs(limits.http_header_timeout_secs);
    let send_timeout = Duration::from_secs(limits.http_send_timeout_secs);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(header_timeout).max_buf_size(CONNECTION_BUFFER_BYTES);
    let builder = Arc::new(builder);
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => break,
            },
            _ = stopped(&mut stop) => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning; the slot is returned.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let builder = builder.clone();
        let mut conn_stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let io = TokioIo::new(SendDeadline::new(stream, send_timeout));
            let conn = builder.serve_connection(io, service).with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "HTTP connection ended with an error");
                    }
                }
                _ = stopped(&mut conn_stop) => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    // Every slot back means every connection has closed.
    let _ = slots.acquire_many(u32::try_from(max).unwrap_or(u32::MAX)).await;
}

/// Resolves once `stop` is true (the watch guard is not held across an await).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// A connection's stream whose writes fail (`TimedOut`) once the client has taken no bytes for
/// `limit` while bytes wait to be sent; hyper then closes the connection and drops the answer.
/// Reads are not timed here (headers and bodies have their own deadlines).
pub struct SendDeadline<S> {
    inner: S,
    limit: Duration,
    /// Armed when a write could not proceed; cleared by any progress.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> SendDeadline<S> {
    pub fn new(inner: S, limit: Duration) -> SendDeadline<S> {
        SendDeadline { inner, limit, stalled: None }
    }

    /// `r`, a write's outcome, with the stall timer armed while it is pending and cleared once
    /// it is not; past `limit` a pending write fails.
    fn timed<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let limit = self.limit;
        let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        limits::refuse(Bound::SendTimeout);
        tracing::debug!("closing a connection whose client took no bytes of its answer");
        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the client took no bytes of the answer")))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SendDeadline<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SendDeadline<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.timed(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.timed(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.timed(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_write_the_peer_does_not_take_fails_after_the_limit_and_progress_rearms_it() {
        let (client, server) = tokio::io::duplex(1024);
        let limit = Duration::from_millis(300);
        let mut server = SendDeadline::new(server, limit);
        let mut client = client;
        // A slow peer takes 1 KiB every 100 ms: each wait is under the limit, their sum well over
        // it, and writes far past the buffer succeed (progress clears the timer).
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; 1024];
            for _ in 0..8 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                client.read_exact(&mut got).await.unwrap();
            }
            client
        });
        server.write_all(&[7u8; 8 * 1024]).await.unwrap();
        let _client = reader.await.unwrap();
        // Now it takes nothing: the buffer fills and, once the limit has passed, the write fails.
        let started = tokio::time::Instant::now();
        let err = server.write_all(&[7u8; 4 * 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= limit, "failed after {:?}", started.elapsed());
    }
}
