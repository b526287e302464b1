//! Bounded blocking work of the HTTP routes (review M3, N5): each route class (`/api`, `/tools`,
//! commands run by `/tools/execute_command`, `/internal` with `/admin` and `/metrics`) may occupy
//! at most `limits.workers_per_route_class` of tokio's blocking threads at once, so one class
//! cannot starve the others (the pool has 512 threads, shared with the object store), and one
//! scope may have at most `limits.max_inflight_per_scope` signed requests in flight (beyond: 429,
//! `Bound::InflightPerScope`).
//!
//! Inside a class, work is queued fairly by who it is for ([`Share`]): one scope holds at most
//! `limits.route_workers_per_scope` of the class's workers and one user at most
//! `limits.route_workers_per_user`; past its share a request waits (asynchronously, holding no
//! worker) for its own earlier work, while other tenants' requests take the free workers.
//!
//! A class permit is held by the blocking closure itself: work whose client went away still counts
//! until it ends, so abandoned requests cannot pile up beyond the bound.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use scopefs::limits::{Bound, LimitsConfig, PerScopeSlots, ScopeSlot};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Which bounded pool a route's blocking work runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteClass {
    /// `/api/*` (the web UI's workspace routes).
    Api,
    /// `/tools/*` (signed agent tools).
    Tools,
    /// `/internal/*`, `/admin/*`, `/metrics`.
    Internal,
    /// Commands of `/tools/execute_command`, which may run for `executor.command_timeout_secs`.
    Exec,
}

impl RouteClass {
    const ALL: [RouteClass; 4] = [RouteClass::Api, RouteClass::Tools, RouteClass::Internal, RouteClass::Exec];

    fn index(self) -> usize {
        RouteClass::ALL.iter().position(|c| *c == self).unwrap_or(0)
    }
}

/// Who a request's blocking work is for: its scope (or, before the scope is known, its thread)
/// and, for signed requests, its user. Each holds at most its share of a class's workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub scope: String,
    pub user: Option<String>,
}

/// The scope already has `max_inflight_per_scope` requests in flight (HTTP 429).
#[derive(Debug, thiserror::Error)]
#[error("this scope already has its maximum number of requests in flight; retry later")]
pub struct ScopeBusy;

/// The class semaphores, the per-scope counters and the shares of each class.
pub struct Pools {
    classes: [Arc<Semaphore>; 4],
    inflight: PerScopeSlots,
    per_scope: usize,
    per_user: usize,
    /// The share semaphores of (class, "s"/"u", scope or user) with work running or waiting.
    shares: Mutex<HashMap<(usize, char, String), Arc<Semaphore>>>,
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
    global().spawn(class, None, f).await
}

/// [`spawn`] for `share`: waits first for a worker within its scope's and user's shares.
pub async fn spawn_as<T, F>(class: RouteClass, share: Share, f: F) -> Result<T, tokio::task::JoinError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    global().spawn(class, Some(&share), f).await
}

/// One in-flight request of `scope`, or [`ScopeBusy`].
pub fn scope_slot(scope: &str) -> Result<InflightSlot, ScopeBusy> {
    global().scope_slot(scope)
}

impl Pools {
    pub fn new(limits: &LimitsConfig) -> Pools {
        let workers = limits.workers_per_route_class.clamp(1, Semaphore::MAX_PERMITS);
        Pools {
            classes: [(); 4].map(|_| Arc::new(Semaphore::new(workers))),
            inflight: PerScopeSlots::new(limits.max_inflight_per_scope as u64, Bound::InflightPerScope),
            per_scope: limits.route_workers_per_scope.clamp(1, workers),
            per_user: limits.route_workers_per_user.clamp(1, workers),
            shares: Mutex::default(),
        }
    }

    fn semaphore(&self, class: RouteClass) -> Arc<Semaphore> {
        self.classes[class.index()].clone()
    }

    /// The share semaphore of `who` (a scope `'s'` or a user `'u'`) in `class`.
    fn share(&self, class: RouteClass, kind: char, who: &str) -> Arc<Semaphore> {
        let size = if kind == 's' { self.per_scope } else { self.per_user };
        let key = (class.index(), kind, who.to_string());
        self.shares.lock().entry(key).or_insert_with(|| Arc::new(Semaphore::new(size))).clone()
    }

    /// Forgets the share semaphores of `share` in `class` nobody holds or waits for.
    fn forget_idle(&self, class: RouteClass, share: &Share) {
        let mut shares = self.shares.lock();
        let keys = [('s', Some(&share.scope)), ('u', share.user.as_ref())];
        for (kind, who) in keys {
            let Some(who) = who else { continue };
            let key = (class.index(), kind, who.clone());
            let idle = shares.get(&key).is_some_and(|s| Arc::strong_count(s) == 1);
            if idle {
                shares.remove(&key);
            }
        }
    }

    /// See [`spawn`] and [`spawn_as`].
    pub async fn spawn<T, F>(&self, class: RouteClass, share: Option<&Share>, f: F) -> Result<T, tokio::task::JoinError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        // Semaphores are never closed, so acquiring only waits. The shares first: a tenant past
        // its share waits without taking a class worker others could use.
        let mut held: Vec<OwnedSemaphorePermit> = Vec::with_capacity(3);
        if let Some(sh) = share {
            let scope = self.share(class, 's', &sh.scope);
            let user = sh.user.as_deref().map(|u| self.share(class, 'u', u));
            held.extend(scope.acquire_owned().await.ok());
            if let Some(user) = user {
                held.extend(user.acquire_owned().await.ok());
            }
        }
        held.extend(self.semaphore(class).acquire_owned().await.ok());
        let out = tokio::task::spawn_blocking(move || {
            let _worker = held;
            f()
        })
        .await;
        if let Some(sh) = share {
            self.forget_idle(class, sh);
        }
        out
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
            p.spawn(RouteClass::Tools, None, move || {
                started_tx.send(()).unwrap();
                wait.recv().unwrap();
            })
            .await
        });
        started.recv().unwrap();
        assert_eq!(pools.free_workers(RouteClass::Tools), 0, "the tools worker is taken");
        // The other classes still run at once while /tools is saturated.
        assert_eq!(rt.block_on(pools.spawn(RouteClass::Api, None, || 7)).unwrap(), 7);
        assert_eq!(rt.block_on(pools.spawn(RouteClass::Internal, None, || 8)).unwrap(), 8);
        release.send(()).unwrap();
        rt.block_on(busy).unwrap().unwrap();
        assert_eq!(pools.free_workers(RouteClass::Tools), 1);
    }

    /// Review N5: inside a class one scope holds at most `route_workers_per_scope` workers and
    /// one user `route_workers_per_user`: a second task of scope `a` waits for the first (holding
    /// no worker), another scope of the same user runs, a third scope of that user waits for the
    /// user's share, and another user runs; waiting tasks start, in the order they queued, only as
    /// their scope's and user's earlier work ends.
    #[test]
    fn a_scope_or_user_past_its_share_waits_and_the_others_are_served() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::mpsc::{channel, Receiver};
        let rt = tokio::runtime::Runtime::new().unwrap();
        let limits = LimitsConfig {
            workers_per_route_class: 4,
            route_workers_per_scope: 1,
            route_workers_per_user: 2,
            ..LimitsConfig::default()
        };
        let pools = Arc::new(Pools::new(&limits));
        let share = |scope: &str, user: &str| Share { scope: scope.into(), user: Some(user.into()) };
        // A task that says when it starts, then blocks until released; returns what `check` said.
        let task = |sh: Share, check: Arc<AtomicBool>| {
            let (started_tx, started) = channel::<()>();
            let (release, wait) = channel::<()>();
            let p = pools.clone();
            let done = rt.spawn(async move {
                p.spawn(RouteClass::Tools, Some(&sh), move || {
                    let ok = check.load(Ordering::SeqCst);
                    started_tx.send(()).unwrap();
                    wait.recv().unwrap();
                    ok
                })
                .await
            });
            (started, release, done)
        };
        let yes = Arc::new(AtomicBool::new(true));
        let a1_done = Arc::new(AtomicBool::new(false));
        let b1_done = Arc::new(AtomicBool::new(false));
        let (a1_started, a1_release, a1) = task(share("a", "u"), yes.clone());
        a1_started.recv().unwrap();
        // Queued behind a1 (scope a's share), then behind the user's share (c1 queues for it
        // first): started before b1 ends, it would see `false`.
        let (a2_started, a2_release, a2) = task(share("a", "u"), b1_done.clone());
        let (b1_started, b1_release, b1) = task(share("b", "u"), yes.clone());
        b1_started.recv().unwrap();
        // User u holds its two workers: scope c of u waits (for a1, the first to end), user v is
        // served.
        let (c1_started, c1_release, c1) = task(share("c", "u"), a1_done.clone());
        let (v_started, v_release, v) = task(share("d", "v"), yes.clone());
        v_started.recv_timeout(std::time::Duration::from_secs(30)).expect("user v is served while u waits");
        assert_eq!(pools.free_workers(RouteClass::Tools), 1, "a1, b1 and v hold workers; a2 and c1 hold none");
        v_release.send(()).unwrap();
        assert!(rt.block_on(v).unwrap().unwrap());
        let finish = |release: std::sync::mpsc::Sender<()>, flag: &AtomicBool, next: &Receiver<()>| {
            flag.store(true, Ordering::SeqCst);
            release.send(()).unwrap();
            next.recv().unwrap();
        };
        finish(a1_release, &a1_done, &c1_started);
        finish(b1_release, &b1_done, &a2_started);
        for (release, done) in [(a2_release, a2), (c1_release, c1)] {
            release.send(()).unwrap();
            assert!(rt.block_on(done).unwrap().unwrap(), "a task started before its share was free");
        }
        assert!(rt.block_on(a1).unwrap().unwrap() && rt.block_on(b1).unwrap().unwrap());
        assert_eq!(pools.free_workers(RouteClass::Tools), 4);
        assert!(pools.shares.lock().is_empty(), "idle shares are forgotten");
    }
}
