//! Bounded blocking work of the HTTP routes (review M3): each route class (`/api`, `/tools`,
//! `/internal` with `/admin` and `/metrics`) may occupy at most `limits.workers_per_route_class`
//! of tokio's blocking threads at once, so one class cannot starve the others (the pool has 512
//! threads, shared with the object store), and one scope may have at most
//! `limits.max_inflight_per_scope` signed requests in flight (beyond: 429, `Bound::InflightPerScope`).
//!
//! A class permit is held by the blocking closure itself: work whose client went away still counts
//! until it ends, so abandoned requests cannot pile up beyond the bound.

use std::sync::{Arc, OnceLock};

use scopefs::limits::{Bound, LimitsConfig, PerScopeSlots, ScopeSlot};
use tokio::sync::Semaphore;

/// Which bounded pool a route's blocking work runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteClass {
    /// `/api/*` (the web UI's workspace routes).
    Api,
    /// `/tools/*` (signed agent tools).
    Tools,
    /// `/internal/*`, `/admin/*`, `/metrics`.
    Internal,
}

/// The scope already has `max_inflight_per_scope` requests in flight (HTTP 429).
#[derive(Debug, thiserror::Error)]
#[error("this scope already has its maximum number of requests in flight; retry later")]
pub struct ScopeBusy;

/// The class semaphores and the per-scope counters.
pub struct Pools {
    classes: [Arc<Semaphore>; 3],
    inflight: PerScopeSlots,
}

static POOLS: OnceLock<Pools> = OnceLock::new();

/// Sets the bounds from `[limits]` (once, at startup; later calls are ignored).
pub fn init(limits: &LimitsConfig) {
    let _ = POOLS.set(Pools::new(limits));
}

/// The configured pools (the defaults when [`init`] was not called, e.g. in unit tests).
pub fn global() -> &'static Pools {
    POOLS.get_or_init(|| Pools::new(&LimitsConfig::default()))
}

/// Runs `f` on a blocking thread of `class`'s pool, waiting (asynchronously) for a free worker.
pub async fn spawn<T, F>(class: RouteClass, f: F) -> Result<T, tokio::task::JoinError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    global().spawn(class, f).await
}

/// One in-flight request of `scope`, or [`ScopeBusy`].
pub fn scope_slot(scope: &str) -> Result<InflightSlot, ScopeBusy> {
    global().scope_slot(scope)
}

impl Pools {
    pub fn new(limits: &LimitsConfig) -> Pools {
        let workers = limits.workers_per_route_class.clamp(1, Semaphore::MAX_PERMITS);
        Pools {
            classes: [(); 3].map(|_| Arc::new(Semaphore::new(workers))),
            inflight: PerScopeSlots::new(limits.max_inflight_per_scope as u64, Bound::InflightPerScope),
        }
    }

    fn semaphore(&self, class: RouteClass) -> Arc<Semaphore> {
        let i = match class {
            RouteClass::Api => 0,
            RouteClass::Tools => 1,
            RouteClass::Internal => 2,
        };
        self.classes[i].clone()
    }

    /// See [`spawn`].
    pub async fn spawn<T, F>(&self, class: RouteClass, f: F) -> Result<T, tokio::task::JoinError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        // The semaphore is never closed, so acquiring only waits.
        let permit = self.semaphore(class).acquire_owned().await.ok();
        tokio::task::spawn_blocking(move || {
            let _worker = permit;
            f()
        })
        .await
    }

    /// See [`scope_slot`]. Checked before any work of the request is done.
    pub fn scope_slot(&self, scope: &str) -> Result<InflightSlot, ScopeBusy> {
        self.inflight.try_acquire(scope).ok_or(ScopeBusy)
    }

    /// Workers of `class` free now.
    #[cfg(test)]
    pub fn free_workers(&self, class: RouteClass) -> usize {
        self.semaphore(class).available_permits()
    }
}

/// One in-flight request of a scope; dropping it frees the slot.
pub type InflightSlot = ScopeSlot;

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> u64 {
        scopefs::limits::refusals().into_iter().find(|(l, _)| *l == "inflight_per_scope").map(|(_, n)| n).unwrap()
    }

    #[test]
    fn a_scope_over_its_inflight_bound_gets_429_and_others_are_served() {
        let pools = Pools::new(&LimitsConfig { max_inflight_per_scope: 2, ..LimitsConfig::default() });
        let a1 = pools.scope_slot("a").unwrap();
        let _a2 = pools.scope_slot("a").unwrap();
        let before = refused();
        let busy = pools.scope_slot("a").unwrap_err();
        assert!(refused() > before, "the refusal is counted for /metrics");
        let answer = crate::api::ApiError::from(busy);
        assert_eq!((answer.status.as_u16(), answer.code), (429, "scope_busy"));
        let _b = pools.scope_slot("b").expect("another scope has its own bound");
        drop(a1);
        pools.scope_slot("a").expect("a finished request frees its slot");
    }

    #[test]
    fn a_saturated_class_does_not_block_another_class() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let pools = Arc::new(Pools::new(&LimitsConfig { workers_per_route_class: 1, ..LimitsConfig::default() }));
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        let p = pools.clone();
        let busy = rt.spawn(async move {
            p.spawn(RouteClass::Tools, move || {
                started_tx.send(()).unwrap();
                wait.recv().unwrap();
            })
            .await
        });
        started.recv().unwrap();
        assert_eq!(pools.free_workers(RouteClass::Tools), 0, "the tools worker is taken");
        // The other classes still run at once while /tools is saturated.
        assert_eq!(rt.block_on(pools.spawn(RouteClass::Api, || 7)).unwrap(), 7);
        assert_eq!(rt.block_on(pools.spawn(RouteClass::Internal, || 8)).unwrap(), 8);
        release.send(()).unwrap();
        rt.block_on(busy).unwrap().unwrap();
        assert_eq!(pools.free_workers(RouteClass::Tools), 1);
    }
}
