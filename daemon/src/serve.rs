//! `scopefs serve`: startup (probe, registry, mounts, recovery), the HTTP server, readiness and graceful shutdown.
//!
//! Order: the listen address is checked, the data directory's lock is taken (or the
//! supervisor's inherited: `datadir_lock`), tokens are loaded, the object store is
//! probed (startup fails if it does not answer correctly), storage, registry and
//! mount manager are opened, the HTTP server starts (`/health` answers at once,
//! `/ready` and `/internal/*` answer 503 until recovery is done), scopes are
//! recovered and remounted, then readiness is reported (`/ready`, `READY=1`).
//! On SIGTERM/SIGINT (a stop): `STOPPING=1`, readiness off, the server stops
//! accepting and drains, each scope's uploads are awaited (bounded; the rest
//! stays journaled), every scope is unmounted, and the process exits 0.
//!
//! Restarts keep the mounts (issue 9): each mount's `/dev/fuse` connection and the HTTP listening
//! socket are handed to the service manager (`fdstore`: systemd's fd store, or the supervisor
//! that runs this process as its worker). A started daemon resumes inherited connections instead
//! of mounting again, and serves the inherited listener. A graceful restart (SIGHUP under the
//! supervisor; SIGTERM under systemd, whose fd store outlives the process) drains HTTP, parks new
//! FUSE requests (`scopefs_fs::pause`), commits open files, waits for uploads, and exits WITHOUT
//! unmounting: requests to the mounts wait in the kernel until the next daemon answers them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use scopefs::config::Config;
use scopefs::engine::Storage;
use scopefs::registry::Registry;
use scopefs_fs::keep::FdKeeper;
use scopefs_fs::MountManager;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::api::{self, AppState};
use crate::datadir_lock::{DataDirLock, Holder};
use crate::notify::notify_or_log;
use crate::services::cluster::{Cluster, ClusterSettings};
use crate::services::compute::{Compute, ComputeSettings};
use crate::services::files::WorkspaceSettings;
use crate::services::open_scopes::OpenScopes;
use crate::services::{ComputeService, LifecycleSettings, Scopes, Services, WorkspaceFiles};
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
    // Before any thread exists (as `fdstore::inherit`): held until the process ends. A worker
    // shares its supervisor's lock; under systemd the daemon takes it.
    let _lock = match DataDirLock::inherited(&cfg.data_dir)? {
        Some(lock) => lock,
        None => DataDirLock::acquire(&cfg.data_dir, &Holder::Daemon)?,
    };
    // Before any thread exists: reads and clears LISTEN_FDS and friends.
    let inherited = crate::fdstore::inherit();
    let keeper: Option<Arc<dyn FdKeeper>> =
        crate::notify::keeps_fds().then(|| Arc::new(crate::fdstore::ManagerKeeper) as Arc<dyn FdKeeper>);
    let rt = setup::runtime()?;
    // Install the handlers first so a signal during startup is not fatal: shutdown follows startup.
    let signals = {
        let _in_runtime = rt.enter();
        let term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
        (term, int, hup)
    };
    let control = setup::control_dir(&cfg).context("preparing the control directory")?;
    let service_token = tokens::load_or_generate(cfg.service_token.as_deref(), &control.join("service-token"))
        .context("loading the service token")?;
    let admin_token = tokens::load_or_generate(cfg.admin_token.as_deref(), &control.join("admin-token"))
        .context("loading the admin token")?;
    let hmac_secret = tokens::load_or_generate(cfg.hmac_secret.as_deref(), &control.join("hmac-secret"))
        .context("loading the HMAC secret of /tools")?;
    crate::pools::init(&cfg.limits);
    log_memory_bound(&cfg);
    match crate::rlimit::raise_open_files(cfg.limits.max_open_files) {
        Ok(n) => tracing::info!(open_files = n, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    let tools_auth = api::ToolsAuth::new(hmac_secret, cfg.signature_window_secs, cfg.max_upload_bytes)
        .with_limits(&cfg.limits)
        .with_peer_views(cfg.peer_views);

    // Strict isolation refuses to start here, before anything is mounted (see `executor::build`).
    let executor = crate::executor::build(&cfg, rt.handle().clone()).context("sandbox executor")?;

    let storage = open_storage(&cfg, &rt)?;
    let registry = open_registry(&cfg, &rt, &storage)?;
    let billing = Arc::new(
        crate::billing_loop::BillingService::new(registry.clone(), cfg.pricing.clone()).with_mode(cfg.billing.mode),
    );
    tracing::info!(schema_version = registry.schema_version(), "registry open");
    if !inherited.mounts.is_empty() {
        tracing::info!(mounts = inherited.mounts.len(), "resuming mounts kept across the restart");
    }
    let mounts = MountManager::resuming(&cfg.mount_root, setup::mount_options(&cfg), inherited.mounts, keeper.clone())
        .context("preparing the mount root")?;
    let services = build_services(
        &cfg,
        registry.deployment(&cfg.deployment_id),
        storage,
        Arc::new(mounts),
        Compute::new(executor, ComputeSettings::from_config(&cfg)),
        billing.clone(),
        rt.handle().clone(),
    );
    services.scopes.verify_cutover_at_startup().map_err(anyhow::Error::msg)?;
    let state = AppState {
        scopes: services.scopes,
        files: services.files,
        compute: services.compute,
        service_token: Arc::new(service_token),
        tools: Arc::new(tools_auth),
        admin_token: Arc::new(admin_token),
        admin_sessions: Arc::new(api::admin_ui::Sessions::default()),
        billing,
        cluster: services.cluster,
    };
    let listener = Listener { addr, inherited: inherited.http, keeper };
    let result = rt.block_on(serve(listener, state, signals));
    rt.shutdown_timeout(Duration::from_secs(5));
    result
}

/// The registry: put back from the bucket first when the data directory has none (a lost disk),
/// and shipped there from now on (`metadata_shipping`).
fn open_registry(cfg: &Config, rt: &tokio::runtime::Runtime, storage: &Storage) -> anyhow::Result<Arc<Registry>> {
    let path = setup::registry_path(cfg);
    // Only the embedded registry is shipped: PostgreSQL is the deployment's shared, durable copy.
    let ship = cfg.metadata_shipping && cfg.registry.url.is_none();
    if ship {
        rt.block_on(crate::registry_ship::restore_if_missing(storage.store().as_ref(), &path))
            .context("restoring the registry from the object store")?;
    }
    let mut registry = setup::open_registry(cfg).context("opening the registry")?;
    // `SCOPEFS_TEST_CLOCK_FILE`, honoured only by test builds (feature `test-hooks`).
    if let Some(clock) = scopefs::testhooks::test_clock() {
        registry = registry.with_clock(clock);
    }
    let registry = Arc::new(registry);
    if ship {
        let _in_runtime = rt.enter();
        let every = Duration::from_millis(cfg.metadata_sync_interval_ms);
        let copy = path.with_extension("sqlite3-ship");
        crate::registry_ship::start(registry.clone(), storage.store().clone(), copy, every);
    }
    Ok(registry)
}

/// The object store (counted for `/metrics`, probed with a put/get/delete) under local storage.
fn open_storage(cfg: &Config, rt: &tokio::runtime::Runtime) -> anyhow::Result<Arc<Storage>> {
    let store = {
        let _in_runtime = rt.enter();
        setup::build_store(cfg).context("configuring the object store")?
    };
    // Counts requests and errors for `/metrics`.
    let store: Arc<dyn scopefs::store::ObjectStore> = Arc::new(crate::metrics::CountingStore(store));
    let described = store.describe();
    rt.block_on(setup::probe_store(store.as_ref(), setup::probe_bound(cfg)))
        .with_context(|| format!("object store probe (put/get/delete) failed on {described}"))?;
    tracing::info!(store = %described, "object store probe passed");
    Storage::new(store, cfg.storage_settings(), &cfg.data_dir, rt.handle().clone()).context("opening local storage")
}

/// The daemon's services over one deployment's registry, its storage and its mounts.
fn build_services(
    cfg: &Config,
    registry: scopefs::registry::DeploymentRegistry,
    storage: Arc<Storage>,
    mounter: Arc<dyn crate::services::mounter::Mounter>,
    compute: Compute,
    billing: Arc<crate::billing_loop::BillingService>,
    rt: tokio::runtime::Handle,
) -> Services {
    storage.set_shared_blocks(Arc::new(crate::services::forks::RegistryHolds(registry.clone())));
    let open = Arc::new(OpenScopes::new(storage, mounter, cfg.default_quota()));
    let compute = Arc::new(
        ComputeService::new(registry.clone(), open.clone(), rt.clone()).with_compute(compute).with_billing(billing),
    );
    let files = Arc::new(WorkspaceFiles::new(registry.clone(), open.clone(), WorkspaceSettings::from_config(cfg)));
    let cluster = ClusterSettings::from_config(cfg)
        .map(|settings| Cluster::new(settings, registry.clone(), open.clone(), compute.clone()));
    let scopes = Arc::new(
        Scopes::new(registry, open, compute.clone(), LifecycleSettings::from_config(cfg))
            .with_cutover(crate::services::CutoverGate::from_config(cfg))
            .with_gc(cfg.gc.clone())
            .with_cluster(cluster.clone()),
    );
    crate::services::forks::keep_outputs_in_snapshots(&scopes);
    Services { scopes, files, compute, cluster }
}

/// Runs `pass` on a blocking thread every `every` until stop (the first one `every` after the
/// start), then `done` with its result (`None`: it panicked, logged as `what`).
async fn every_until_stop<R: Send + 'static>(
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    what: &'static str,
    pass: impl Fn() -> R + Clone + Send + 'static,
    done: impl Fn(Option<R>),
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let result = tokio::task::spawn_blocking(pass.clone()).await;
        if let Err(e) = &result {
            tracing::error!(error = %e, "{what} panicked");
        }
        done(result.ok());
    }
}

/// Runs a maintenance pass (open operations, draft expiry, purge, local scan) every interval until
/// stop; each pass takes the `maintenance` lease when it has registry work, and is skipped (and
/// counted) while an operator holds it.
async fn maintenance_loop(service: Arc<Scopes>, stop: tokio::sync::watch::Receiver<bool>) {
    let every = service.lifecycle_settings().maintenance_interval;
    every_until_stop(
        every,
        stop,
        "maintenance pass",
        move || service.maintenance_pass(),
        |result| {
            match result {
                Some(Ok(report)) if !report.is_quiet() => tracing::info!(?report, "maintenance pass"),
                Some(Err(e)) => tracing::error!(error = %e, "maintenance pass failed"),
                _ => {}
            }
            crate::metrics::note_maintenance_pass();
        },
    )
    .await
}

/// Runs an online gc pass over the open scopes every `every` until stop (`[gc]`).
async fn gc_loop(service: Arc<Scopes>, every: Duration, stop: tokio::sync::watch::Receiver<bool>) {
    every_until_stop(
        every,
        stop,
        "online gc pass",
        move || service.gc_pass(),
        |result| {
            if let Some(report) = result.filter(|r| r.blocks_deleted > 0 || r.failed > 0) {
                tracing::info!(?report, "online gc pass");
            }
            crate::metrics::note_gc_pass();
        },
    )
    .await
}

/// How the process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Unmount every scope (a real stop).
    Stop,
    /// Keep the mounts for the next daemon process (a restart).
    Restart,
}

/// Resolves once a stop or restart signal arrives. Under systemd with a descriptor store, SIGTERM
/// is a restart too: `systemctl restart` and `Restart=` keep the store (systemd's default
/// `FileDescriptorStorePreserve=restart`), and a stop closes it, which ends the mounts anyway.
async fn stop_signal(mut term: Signal, mut int: Signal, mut hup: Signal) -> (&'static str, Ending) {
    let kept = crate::notify::keeps_fds();
    let under_systemd = kept && !crate::notify::supervised();
    loop {
        tokio::select! {
            _ = term.recv() => return ("SIGTERM", if under_systemd { Ending::Restart } else { Ending::Stop }),
            _ = int.recv() => return ("SIGINT", Ending::Stop),
            _ = hup.recv() => {
                if kept {
                    return ("SIGHUP", Ending::Restart);
                }
                tracing::warn!("SIGHUP ignored: no service manager keeps the mounts across a restart");
            }
        }
    }
}

/// The HTTP listening socket: inherited from the previous process, or bound (and then kept).
struct Listener {
    addr: SocketAddr,
    inherited: Option<std::os::fd::OwnedFd>,
    keeper: Option<Arc<dyn FdKeeper>>,
}

/// How long binding waits for a dying predecessor to release the port.
const BIND_RETRY: Duration = Duration::from_secs(5);

impl Listener {
    async fn open(self) -> anyhow::Result<tokio::net::TcpListener> {
        let addr = self.addr;
        if let Some(fd) = self.inherited {
            let std_listener = std::net::TcpListener::from(fd);
            if std_listener.local_addr().ok() == Some(addr) {
                std_listener.set_nonblocking(true).context("inherited HTTP socket")?;
                tracing::info!(listen = %addr, "HTTP API listening (inherited socket)");
                return tokio::net::TcpListener::from_std(std_listener).context("inherited HTTP socket");
            }
            tracing::info!("the inherited HTTP socket has another address; binding the configured one");
        }
        let deadline = tokio::time::Instant::now() + BIND_RETRY;
        let listener = loop {
            match tokio::net::TcpListener::bind(addr).await {
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => break other.with_context(|| format!("binding {addr}"))?,
            }
        };
        if let Some(keeper) = &self.keeper {
            use std::os::fd::AsFd;
            if let Err(e) = keeper.keep(crate::fdstore::HTTP_FD_NAME, listener.as_fd()) {
                tracing::warn!(error = %e, "cannot keep the HTTP socket across restarts");
            }
        }
        tracing::info!(listen = %addr, "HTTP API listening");
        Ok(listener)
    }
}

async fn serve(listener: Listener, state: AppState, (term, int, hup): (Signal, Signal, Signal)) -> anyhow::Result<()> {
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let (ending_tx, ending_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (which, ending) = stop_signal(term, int, hup).await;
        tracing::info!(signal = which, ?ending, "shutting down");
        let _ = ending_tx.send(ending);
        let _ = stop_tx.send(true);
    });

    let service = state.scopes.clone();
    let compute = state.compute.clone();
    let cluster = state.cluster.clone();
    let billing = state.billing.clone();
    let listener = listener.open().await?;
    let limits = state.tools.limits.clone();
    let app = api::router(state);
    let server = tokio::spawn({
        let stop = stop_rx.clone();
        async move { crate::http::serve(listener, app, &limits, stop).await }
    });

    let svc = service.clone();
    let recovered = tokio::task::spawn_blocking(move || {
        // Containers first: a restart ends every environment whose mount is dead.
        // Environments of scopes whose mount was kept are adopted, not ended.
        let resumed = svc.open_scopes().mounter().inherited_scopes().into_iter().collect();
        match compute.reconcile_compute_at_startup(&resumed) {
            Ok(r) => tracing::info!(?r, "environments reconciled"),
            Err(e) => tracing::error!(error = %e, "environment reconciliation failed; retried before compute requests"),
        }
        let report = svc.recover()?;
        // Kept mounts of scopes this daemon no longer serves (deleted meanwhile) end here.
        svc.open_scopes().mounter().drop_unclaimed();
        // Finishes deletes and purges a crash interrupted, before readiness.
        let maintenance = svc.maintenance_pass()?;
        Ok::<_, crate::services::ServiceError>((report, maintenance))
    });
    match recovered.await {
        Ok(Ok((report, maintenance))) => {
            tracing::info!(mounted = report.mounted, failed = report.failed, ?maintenance, "scopes recovered");
            tokio::spawn(maintenance_loop(service.clone(), stop_rx.clone()));
            if let Some(every) = service.gc_interval() {
                tokio::spawn(gc_loop(service.clone(), every, stop_rx.clone()));
            }
            tokio::spawn(crate::billing_loop::run(billing.clone(), stop_rx.clone()));
            if let Some(cluster) = cluster {
                tracing::info!(node = cluster.node_id(), serves = cluster.served(), "serving as one node of several");
                tokio::spawn(cluster.run(stop_rx.clone()));
            }
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
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "HTTP server task failed"),
        Err(_) => tracing::warn!("HTTP requests still running after the drain period"),
    }
    let ending = ending_rx.await.unwrap_or(Ending::Stop);
    let svc = service.clone();
    if ending == Ending::Restart {
        tokio::task::spawn_blocking(move || svc.release(UPLOAD_DRAIN)).await.context("releasing scopes")?;
        // The mount manager must never be dropped in this process: dropping unmounts.
        std::mem::forget(service);
        tracing::info!("stopped; mounts kept for the next daemon process");
        return Ok(());
    }
    tokio::task::spawn_blocking(move || svc.shutdown(UPLOAD_DRAIN)).await.context("shutting scopes down")?;
    tracing::info!("stopped");
    Ok(())
}

/// Exports the configuration's memory bound and says how it compares with the cgroup's
/// `memory.max` (a limit below it can OOM-kill the daemon under load its configuration admits).
fn log_memory_bound(cfg: &Config) {
    let bound = crate::memory_bound::MemoryBound::of(cfg).total();
    crate::metrics::set_memory_bound(bound);
    let bound_mib = bound.div_ceil(1 << 20);
    match crate::memory_bound::cgroup_memory_max() {
        Some(max) if max < bound => tracing::warn!(
            bound_mib,
            memory_max_mib = max >> 20,
            "the cgroup's memory limit is below the configuration's memory bound (scopefs serve --print-config); \
             lower the budgets or raise MemoryMax="
        ),
        Some(max) => tracing::info!(bound_mib, memory_max_mib = max >> 20, "memory bound within the cgroup's limit"),
        None => tracing::info!(bound_mib, "memory bound (no cgroup memory limit)"),
    }
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
