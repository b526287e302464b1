//! `scopefs serve`: startup (probe, registry, mounts, recovery), the HTTP server, readiness and graceful shutdown.
//!
//! Order: the listen address is checked, tokens are loaded, the object store is
//! probed (startup fails if it does not answer correctly), storage, registry and
//! mount manager are opened, the HTTP server starts (`/health` answers at once,
//! `/ready` and `/internal/*` answer 503 until recovery is done), scopes are
//! recovered and remounted, then readiness is reported (`/ready`, `READY=1`).
//! On SIGTERM/SIGINT: `STOPPING=1`, readiness off, the server stops accepting
//! and drains, each scope's uploads are awaited (bounded; the rest stays
//! journaled), every scope is unmounted, and the process exits 0.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use scopefs::config::Config;
use scopefs::engine::Storage;
use scopefs::registry::Registry;
use scopefs_fs::MountManager;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::api::{self, AppState};
use crate::notify::notify_or_log;
use crate::service::ScopeService;
use crate::{setup, tokens};

/// Bound on draining in-flight HTTP requests at shutdown.
const HTTP_DRAIN: Duration = Duration::from_secs(10);
/// Bound on waiting for uploads at shutdown (across all scopes).
const UPLOAD_DRAIN: Duration = Duration::from_secs(20);

/// The address to listen on; a non-loopback address needs `allow_remote = true`.
pub fn listen_addr(cfg: &Config) -> anyhow::Result<SocketAddr> {
    let addr: SocketAddr =
        cfg.listen.parse().with_context(|| format!("listen = {:?} is not an IP:port address", cfg.listen))?;
    if !addr.ip().is_loopback() && !cfg.allow_remote {
        bail!("refusing to listen on non-loopback address {addr}: set allow_remote = true to allow it");
    }
    Ok(addr)
}

pub fn run(cfg: Config) -> anyhow::Result<()> {
    let addr = listen_addr(&cfg)?;
    let rt = setup::runtime()?;
    // Install the handlers first so a signal during startup is not fatal: shutdown follows startup.
    let signals = {
        let _in_runtime = rt.enter();
        let term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        (term, int)
    };
    let control = setup::control_dir(&cfg).context("preparing the control directory")?;
    let service_token = tokens::load_or_generate(cfg.service_token.as_deref(), &control.join("service-token"))
        .context("loading the service token")?;
    // Generated now so operators find it; the admin routes use it.
    tokens::load_or_generate(cfg.admin_token.as_deref(), &control.join("admin-token"))
        .context("loading the admin token")?;

    let store = {
        let _in_runtime = rt.enter();
        setup::build_store(&cfg).context("configuring the object store")?
    };
    let described = store.describe();
    rt.block_on(setup::probe_store(store.as_ref(), setup::probe_bound(&cfg)))
        .with_context(|| format!("object store probe (put/get/delete) failed on {described}"))?;
    tracing::info!(store = %described, "object store probe passed");

    let storage = Storage::new(store, cfg.storage_settings(), &cfg.data_dir, rt.handle().clone())
        .context("opening local storage")?;
    let registry = Arc::new(Registry::open(&setup::registry_path(&cfg)).context("opening the registry")?);
    tracing::info!(schema_version = registry.schema_version(), "registry open");
    let mounts = MountManager::new(&cfg.mount_root, setup::mount_options(&cfg)).context("preparing the mount root")?;
    let service =
        Arc::new(ScopeService::new(cfg.deployment_id.clone(), cfg.default_quota(), registry, storage, mounts));
    let state = AppState { service: service.clone(), service_token: Arc::new(service_token) };
    let result = rt.block_on(serve(addr, state, signals));
    rt.shutdown_timeout(Duration::from_secs(5));
    result
}

/// Resolves once SIGTERM or SIGINT arrives.
async fn stop_signal(mut term: Signal, mut int: Signal) -> &'static str {
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

async fn serve(addr: SocketAddr, state: AppState, (term, int): (Signal, Signal)) -> anyhow::Result<()> {
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let which = stop_signal(term, int).await;
        tracing::info!(signal = which, "shutting down");
        let _ = stop_tx.send(true);
    });

    let service = state.service.clone();
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    tracing::info!(listen = %addr, "HTTP API listening");
    let mut server_stop = stop_rx.clone();
    let server = tokio::spawn(
        axum::serve(listener, api::router(state))
            .with_graceful_shutdown(async move {
                let _ = server_stop.wait_for(|stop| *stop).await;
            })
            .into_future(),
    );

    let svc = service.clone();
    match tokio::task::spawn_blocking(move || svc.recover()).await {
        Ok(Ok(report)) => {
            tracing::info!(mounted = report.mounted, failed = report.failed, "scopes recovered");
            service.set_ready(true);
            notify_or_log("READY=1");
            tracing::info!("ready");
        }
        Ok(Err(e)) => tracing::error!(error = %e, "scope recovery failed; staying unready"),
        Err(e) => tracing::error!(error = %e, "scope recovery panicked; staying unready"),
    }

    let _ = stop_rx.wait_for(|stop| *stop).await;
    notify_or_log("STOPPING=1");
    service.set_ready(false);
    match tokio::time::timeout(HTTP_DRAIN, server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::error!(error = %e, "HTTP server failed"),
        Ok(Err(e)) => tracing::error!(error = %e, "HTTP server task failed"),
        Err(_) => tracing::warn!("HTTP requests still running after the drain period"),
    }
    let svc = service.clone();
    tokio::task::spawn_blocking(move || svc.shutdown(UPLOAD_DRAIN)).await.context("shutting scopes down")?;
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_loopback_listen_needs_allow_remote() {
        let mut cfg = Config { listen: "127.0.0.1:7070".into(), ..Config::default() };
        assert_eq!(listen_addr(&cfg).unwrap().port(), 7070);
        cfg.listen = "[::1]:7070".into();
        assert!(listen_addr(&cfg).is_ok());
        cfg.listen = "0.0.0.0:7070".into();
        let err = listen_addr(&cfg).unwrap_err().to_string();
        assert!(err.contains("allow_remote"), "{err}");
        cfg.allow_remote = true;
        assert!(listen_addr(&cfg).is_ok());
        cfg.listen = "localhost".into();
        assert!(listen_addr(&cfg).is_err());
    }
}
