//! The HTTP/1.1 accept loop (review L12): at most `limits.http_max_connections` connections are
//! served at once (more wait in the listen backlog), a client must send a request's headers
//! within `limits.http_header_timeout_secs` (a slowloris connection is closed), and at shutdown
//! every connection finishes its request and closes, bounded by the caller's drain period.
//! The per-request deadline is a router layer (`api::request_deadline`).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use scopefs::limits::LimitsConfig;
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
            let conn = builder.serve_connection(TokioIo::new(stream), service).with_upgrades();
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
