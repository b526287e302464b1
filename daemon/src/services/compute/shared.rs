//! Shared compute (seed 003 §5, §15): which environments are eligible (one table, [`RULES`]), and
//! the per-user pools of warm containers they run in.
//!
//! An environment that asks for shared compute (`execution_mode` "simple"/"shared" or
//! `shared_compute_eligible`) and passes every rule runs in a warm container of its **user's** own
//! pool; anything else gets a dedicated container as before and answers `execution_mode:
//! "standard"` (seed §5 option 2, §15.3: routing to standard is the answer to "not eligible").
//!
//! Reuse and isolation: a pooled container is keyed by its user and its whole `ContainerSpec`
//! (scope, workspace mount, read-only flag, every extra mount) minus the environment's ids, so it is
//! only ever reused by a later environment of the same user with exactly the same mounts: it never
//! sees two users' scopes, nor two scopes. One environment holds a container at a time. At release
//! every process the environment left behind is killed and `/tmp` emptied; a container that does
//! not come back clean, or whose `/workspace` no longer answers at the next lease, is removed
//! instead of reused. The container policy (no network, capabilities dropped, non-root user,
//! limits) is the dedicated one; a configured network other than `none` makes nothing eligible.
//! Warm containers unused for `limits.shared_idle_secs` are removed; a user keeps at most
//! `limits.max_shared_environments_per_user` warm ones and leases at most as many at once (one
//! more shared request is 429 before anything runs).
//!
//! Billing is untouched: a shared environment is an environment row like any other, preflighted at
//! create and recorded at its end by the same code.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use scopefs::config::Config;
use scopefs::executor::{ContainerSpec, ExecRequest, ExecutorError};
use scopefs::limits::{Bound, PerScopeSlots, ScopeSlot};

use super::{reason, Compute, ComputeError, ComputeService, CreateEnvironment};

/// `backend_type` and `resource_ref` of a shared environment (seed 003 §5's example).
pub const SHARED_BACKEND: &str = "shared_compute";
pub const SHARED_RESOURCE: &str = "shared-worker-pool/default";

/// The `[limits]` of shared compute, and whether the container policy allows it at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedSettings {
    pub per_user: u64,
    pub max_runtime_secs: u64,
    pub idle: Duration,
    pub max_input_bytes: u64,
    pub max_output_bytes: u64,
    pub max_stdout_stderr_bytes: u64,
    pub max_files: u64,
    /// `executor.network = "none"`: containers have no network.
    pub no_network: bool,
}

impl SharedSettings {
    pub fn from_config(cfg: &Config) -> SharedSettings {
        let l = &cfg.limits;
        SharedSettings {
            per_user: l.max_shared_environments_per_user,
            max_runtime_secs: l.shared_max_runtime_secs,
            idle: Duration::from_secs(l.shared_idle_secs),
            max_input_bytes: l.shared_max_input_bytes,
            max_output_bytes: l.shared_max_output_bytes,
            max_stdout_stderr_bytes: l.shared_max_stdout_stderr_bytes,
            max_files: l.shared_max_files,
            no_network: cfg.executor.network == "none",
        }
    }
}

/// What a create request says about shared compute (from its seed fields).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedRequest {
    /// The mode a shared environment answers with ("simple" or "shared"); `None`: not asked for.
    pub asked: Option<&'static str>,
    pub resource_class: Option<String>,
    pub backend_policy: Option<String>,
    /// Sum of the `input_objects`' `size_bytes`.
    pub input_bytes: u64,
    /// `limits.max_input_bytes`.
    pub max_input_bytes: Option<u64>,
    /// `limits.max_user_concurrency`: the user's live shared environments, this one included.
    pub max_user_concurrency: Option<u64>,
}

/// A rule of seed 003 §15.1: what it checks (the reason a request is not eligible) and the check.
type Rule = (&'static str, fn(&SharedSettings, &CreateEnvironment) -> bool);

fn at_most(v: Option<u64>, max: u64) -> bool {
    v.is_none_or(|v| v <= max)
}

/// Every condition of shared compute, in one place. A request must pass all of them.
pub const RULES: &[Rule] = &[
    ("shared compute is off (limits.max_shared_environments_per_user = 0)", |s, _| s.per_user > 0),
    ("containers have a network (executor.network is not \"none\")", |s, _| s.no_network),
    ("max runtime missing or above limits.shared_max_runtime_secs", |s, r| {
        r.max_runtime_seconds.is_some_and(|t| t <= s.max_runtime_secs)
    }),
    ("input_objects above limits.shared_max_input_bytes", |s, r| {
        r.shared.input_bytes <= s.max_input_bytes && at_most(r.shared.max_input_bytes, s.max_input_bytes)
    }),
    ("input_objects or limits.max_files above limits.shared_max_files", |s, r| {
        r.input_objects as u64 <= s.max_files && at_most(r.options.max_artifact_files, s.max_files)
    }),
    ("limits.max_output_bytes above limits.shared_max_output_bytes", |s, r| {
        at_most(r.options.max_artifact_bytes, s.max_output_bytes)
    }),
    ("limits.max_stdout_stderr_bytes above limits.shared_max_stdout_stderr_bytes", |s, r| {
        at_most(r.options.max_output_bytes, s.max_stdout_stderr_bytes)
    }),
    ("resource_class other than small or shared-small (GPU, large)", |_, r| {
        matches!(r.shared.resource_class.as_deref(), None | Some("small" | "shared-small"))
    }),
    ("limits.max_user_concurrency is 0", |_, r| r.shared.max_user_concurrency != Some(0)),
    ("backend_policy asks for a dedicated backend", |_, r| {
        matches!(r.shared.backend_policy.as_deref(), None | Some("auto" | "shared" | "simple" | "shared_compute"))
    }),
];

/// Where an environment runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A dedicated container; the reason when shared compute was asked for and refused.
    Standard(Option<&'static str>),
    /// The user's shared pool, answering with this mode.
    Shared(&'static str),
}

/// Seed §15.1: shared only when asked for and every rule holds.
pub fn decide(settings: &SharedSettings, req: &CreateEnvironment) -> Decision {
    let Some(mode) = req.shared.asked else { return Decision::Standard(None) };
    match RULES.iter().find(|(_, ok)| !ok(settings, req)) {
        Some((why, _)) => Decision::Standard(Some(why)),
        None => Decision::Shared(mode),
    }
}

/// `req` as a shared environment runs it: the shared output, stdout/stderr and file caps apply
/// (also when the request named none), and the mode is recorded.
pub fn shared_request(settings: &SharedSettings, req: &CreateEnvironment, mode: &'static str) -> CreateEnvironment {
    let cap = |v: Option<u64>, max: u64| Some(v.unwrap_or(max).min(max));
    let mut out = req.clone();
    out.options.max_output_bytes = cap(req.options.max_output_bytes, settings.max_stdout_stderr_bytes);
    out.options.max_artifact_files = cap(req.options.max_artifact_files, settings.max_files);
    out.options.max_artifact_bytes = cap(req.options.max_artifact_bytes, settings.max_output_bytes);
    out.options.execution_mode = Some(mode.to_string());
    out
}

/// Which warm containers an environment may reuse: same user, same spec but for its own ids.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PoolKey {
    user_id: String,
    spec: ContainerSpec,
}

impl PoolKey {
    fn of(user_id: &str, spec: &ContainerSpec) -> PoolKey {
        let spec = ContainerSpec { owner_id: String::new(), environment_id: String::new(), ..spec.clone() };
        PoolKey { user_id: user_id.to_string(), spec }
    }
}

struct Warm {
    key: PoolKey,
    container: String,
    since: Instant,
}

struct Lease {
    user_id: String,
    /// `None`: adopted after a restart (its mounts are not known for certain), never reused.
    key: Option<PoolKey>,
    container: String,
    _slot: ScopeSlot,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<Warm>,
    leased: HashMap<String, Lease>,
}

/// The warm containers of every user, and their leases (see the module docs).
pub struct SharedPool {
    settings: SharedSettings,
    users: PerScopeSlots,
    state: Mutex<PoolState>,
}

/// Where a created environment's container comes from.
pub enum Route {
    Dedicated,
    /// The user's pool; the slot counts against `max_shared_environments_per_user`.
    Shared(ScopeSlot),
}

impl SharedPool {
    pub fn new(settings: SharedSettings) -> SharedPool {
        let users = PerScopeSlots::new(settings.per_user, Bound::SharedPerUser);
        SharedPool { settings, users, state: Mutex::default() }
    }

    pub fn settings(&self) -> &SharedSettings {
        &self.settings
    }

    /// A slot for one more shared environment of `user` while it has fewer than `at_most` (the
    /// request's `max_user_concurrency`) and `per_user`, or 429 `TooMany`.
    pub fn reserve(&self, user: &str, at_most: Option<u64>) -> Result<ScopeSlot, ComputeError> {
        self.users.try_acquire_within(user, at_most.unwrap_or(u64::MAX)).ok_or(ComputeError::TooMany(
            "concurrent shared environments of this user (limits.max_user_concurrency of the request, \
             limits.max_shared_environments_per_user)",
        ))
    }

    /// The newest warm container `key` may reuse, taken out of the idle list.
    fn take_idle(&self, key: &PoolKey) -> Option<String> {
        let mut st = self.state.lock();
        let i = st.idle.iter().rposition(|w| w.key == *key)?;
        Some(st.idle.remove(i).container)
    }

    fn lease(&self, env_id: &str, key: PoolKey, container: &str, slot: ScopeSlot) {
        let lease =
            Lease { user_id: key.user_id.clone(), key: Some(key), container: container.to_string(), _slot: slot };
        self.state.lock().leased.insert(env_id.to_string(), lease);
    }

    /// A running shared environment of `user_id` adopted after a restart: its lease and user slot
    /// come back (counted even beyond `per_user`, so new shared work waits for it), and its
    /// container is removed, not reused, when it ends.
    pub(super) fn adopt(&self, env_id: &str, user_id: &str, container: &str) {
        let slot = self.users.acquire_running(user_id);
        let lease = Lease { user_id: user_id.to_string(), key: None, container: container.to_string(), _slot: slot };
        self.state.lock().leased.insert(env_id.to_string(), lease);
    }

    /// Ends `env_id`'s lease (its user slot is freed); its key (if reusable) and container if it
    /// had one.
    fn release(&self, env_id: &str) -> Option<(Option<PoolKey>, String)> {
        self.state.lock().leased.remove(env_id).map(|l| (l.key, l.container.clone()))
    }

    /// Puts a clean container back; returns the containers to remove (the user's oldest beyond
    /// `per_user` warm ones).
    fn park(&self, key: PoolKey, container: String, now: Instant) -> Vec<String> {
        let mut st = self.state.lock();
        let user = key.user_id.clone();
        st.idle.push(Warm { key, container, since: now });
        let mut evicted = Vec::new();
        while st.idle.iter().filter(|w| w.key.user_id == user).count() as u64 > self.settings.per_user {
            if let Some(i) = st.idle.iter().position(|w| w.key.user_id == user) {
                evicted.push(st.idle.remove(i).container);
            }
        }
        evicted
    }

    /// Takes out the warm containers idle since `idle` before `now`.
    pub fn expired(&self, now: Instant) -> Vec<String> {
        let idle = self.settings.idle;
        let mut st = self.state.lock();
        let (old, keep) = std::mem::take(&mut st.idle).into_iter().partition(|w| now.duration_since(w.since) >= idle);
        st.idle = keep;
        old.into_iter().map(|w: Warm| w.container).collect()
    }

    /// Takes out the warm containers bound to `scope_id`.
    fn drop_scope(&self, scope_id: &str) -> Vec<String> {
        let mut st = self.state.lock();
        let (gone, keep) = std::mem::take(&mut st.idle).into_iter().partition(|w| w.key.spec.scope_id == scope_id);
        st.idle = keep;
        gone.into_iter().map(|w: Warm| w.container).collect()
    }

    /// A warm container stopped: forgets it; the environment that held it, if any.
    fn stopped(&self, container: &str) -> Option<String> {
        let mut st = self.state.lock();
        st.idle.retain(|w| w.container != container);
        st.leased.iter().find(|(_, l)| l.container == container).map(|(env, _)| env.clone())
    }

    /// Whether the pool holds `container` (warm or leased): reconciliation keeps it.
    pub fn holds(&self, container: &str) -> bool {
        let st = self.state.lock();
        st.idle.iter().any(|w| w.container == container) || st.leased.values().any(|l| l.container == container)
    }

    /// (warm, leased) containers of `user`.
    pub fn counts(&self, user: &str) -> (usize, usize) {
        let st = self.state.lock();
        let warm = st.idle.iter().filter(|w| w.key.user_id == user).count();
        (warm, st.leased.values().filter(|l| l.user_id == user).count())
    }
}

/// Run at release: kills every process but the container's init and main process, empties `/tmp`,
/// and exits 0 only if nothing else is left.
const CLEANUP: &str = r#"main=; for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] && continue; if [ -z "$main" ] || [ "$p" -lt "$main" ]; then main=$p; fi; done
for d in /proc/[0-9]*; do p=${d#/proc/}; case "$p" in 1|"$main"|"$$") ;; *) kill -9 "$p" 2>/dev/null ;; esac; done
rm -rf /tmp/* /tmp/.[!.]* /tmp/..?* 2>/dev/null
for i in 1 2 3 4 5 6 7 8 9 10; do left=0; for d in /proc/[0-9]*; do p=${d#/proc/}; case "$p" in 1|"$main"|"$$") ;; *) [ -d "$d" ] && left=1 ;; esac; done; [ $left = 0 ] && break; sleep 0.1; done
[ $left = 0 ] && [ -z "$(ls -A /tmp)" ]"#;

/// Run at lease: the workspace mount still answers.
const CHECK: &str = "ls /workspace/. >/dev/null";

/// The mode, backend and resource an environment answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    pub mode: String,
    pub backend_type: &'static str,
    /// `None`: a dedicated container (the caller names it).
    pub resource_ref: Option<&'static str>,
}

impl Execution {
    /// A dedicated container.
    pub fn standard() -> Execution {
        Execution { mode: "standard".into(), backend_type: "docker", resource_ref: None }
    }

    /// The shared pool, asked for as `mode`.
    pub fn shared(mode: &str) -> Execution {
        Execution { mode: mode.into(), backend_type: SHARED_BACKEND, resource_ref: Some(SHARED_RESOURCE) }
    }
}

impl ComputeService {
    /// Seed §15: the request as it runs and where (429 when the user's shared slots are taken).
    pub(super) fn route(
        &self,
        compute: &Compute,
        user_id: &str,
        req: &CreateEnvironment,
    ) -> Result<(Route, CreateEnvironment), ComputeError> {
        match decide(compute.shared.settings(), req) {
            Decision::Standard(why) => {
                if let Some(why) = why {
                    tracing::info!(reason = why, "shared compute asked for but not eligible: dedicated container");
                }
                Ok((Route::Dedicated, req.clone()))
            }
            Decision::Shared(mode) => {
                let slot = compute.shared.reserve(user_id, req.shared.max_user_concurrency)?;
                Ok((Route::Shared(slot), shared_request(compute.shared.settings(), req, mode)))
            }
        }
    }

    fn run_quiet(compute: &Compute, container: &str, command: &str) -> bool {
        let req = ExecRequest { command: command.into(), timeout: Duration::from_secs(10), max_output_bytes: 1024 };
        compute.executor.exec(container, &req).is_ok_and(|o| o.exit_code == Some(0) && !o.timed_out)
    }

    /// The container of a new environment and whether the caller watches it (a pooled one is
    /// watched by the pool, once).
    pub(super) fn container_for(
        self: &Arc<Self>,
        compute: &Compute,
        spec: &ContainerSpec,
        user_id: &str,
        route: Route,
    ) -> Result<(String, bool), ExecutorError> {
        let slot = match route {
            Route::Dedicated => return Ok((compute.executor.create(spec)?, true)),
            Route::Shared(slot) => slot,
        };
        let key = PoolKey::of(user_id, spec);
        while let Some(c) = compute.shared.take_idle(&key) {
            if Self::run_quiet(compute, &c, CHECK) {
                compute.shared.lease(&spec.environment_id, key, &c, slot);
                return Ok((c, false));
            }
            let _ = compute.executor.remove(&c);
        }
        let c = compute.executor.create(spec)?;
        compute.shared.lease(&spec.environment_id, key, &c, slot);
        let svc = self.clone();
        let watched = c.clone();
        let on_stop = Box::new(move || svc.shared_container_stopped(&watched));
        if let Err(e) = compute.executor.watch(&c, on_stop) {
            tracing::warn!(error = %e, "cannot watch a shared container");
        }
        Ok((c, false))
    }

    /// A pooled container stopped: the environment holding it (if any) has ended.
    pub(super) fn shared_container_stopped(&self, container: &str) {
        let Some(compute) = self.compute.as_ref() else { return };
        let Some(env_id) = compute.shared.stopped(container) else { return };
        if compute.stopping.lock().contains(&env_id) {
            return;
        }
        if let Err(e) = self.registry.end_environment(&env_id, false, reason::EXITED) {
            tracing::error!(environment_id = %env_id, error = %e, "recording a stopped shared container failed");
        }
    }

    /// Gives back the container of an ending environment: a leased one is cleaned and kept warm
    /// (after a normal destroy) or removed; a dedicated one is removed.
    pub(super) fn release_container(
        &self,
        compute: &Compute,
        env_id: &str,
        container: &str,
        why: &str,
    ) -> Result<(), ExecutorError> {
        let Some((key, c)) = compute.shared.release(env_id) else { return compute.executor.remove(container) };
        let Some(key) = key.filter(|_| why == reason::DESTROYED) else { return compute.executor.remove(&c) };
        if !Self::run_quiet(compute, &c, CLEANUP) {
            return compute.executor.remove(&c);
        }
        for old in compute.shared.park(key, c, Instant::now()) {
            compute.executor.remove(&old)?;
        }
        schedule_reap(&self.rt, compute);
        Ok(())
    }

    /// Removes the warm containers idle for `limits.shared_idle_secs` at `now`; how many.
    pub fn reap_shared(&self, now: Instant) -> usize {
        self.compute.as_ref().map_or(0, |c| reap(&c.shared, c.executor.as_ref(), now))
    }

    /// Scope delete: its warm containers go (they bind its mountpoint).
    pub(super) fn drop_shared_scope(&self, compute: &Compute, scope_id: &str) {
        for c in compute.shared.drop_scope(scope_id) {
            if compute.executor.remove(&c).is_err() {
                compute.set_reconciled(false);
            }
        }
    }

    /// How `env_id` runs (seed §5 response fields).
    pub fn execution_of(&self, env_id: &str) -> Execution {
        let mode = self
            .registry
            .environment_options(env_id)
            .ok()
            .flatten()
            .and_then(|json| serde_json::from_str::<super::EnvironmentOptions>(&json).ok())
            .and_then(|o| o.execution_mode);
        mode.map_or_else(Execution::standard, |m| Execution::shared(&m))
    }
}

/// Removes the warm containers of `pool` idle at `now`; how many.
fn reap(pool: &SharedPool, executor: &dyn scopefs::executor::Executor, now: Instant) -> usize {
    let old = pool.expired(now);
    for c in &old {
        if let Err(e) = executor.remove(c) {
            tracing::warn!(error = %e, "removing an idle shared container failed; reconciliation removes it");
        }
    }
    old.len()
}

/// Reaps `compute`'s pool once `limits.shared_idle_secs` have passed.
fn schedule_reap(rt: &tokio::runtime::Handle, compute: &Compute) {
    let pool = compute.shared.clone();
    let executor = compute.executor.clone();
    let after = pool.settings().idle;
    rt.spawn(async move {
        tokio::time::sleep(after).await;
        let _ = tokio::task::spawn_blocking(move || reap(&pool, executor.as_ref(), Instant::now())).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> SharedSettings {
        SharedSettings {
            per_user: 2,
            max_runtime_secs: 60,
            idle: Duration::from_secs(120),
            max_input_bytes: 10 << 20,
            max_output_bytes: 10 << 20,
            max_stdout_stderr_bytes: 1 << 20,
            max_files: 100,
            no_network: true,
        }
    }

    /// A small request that asks for shared compute.
    fn small() -> CreateEnvironment {
        CreateEnvironment {
            max_runtime_seconds: Some(60),
            shared: SharedRequest { asked: Some("simple"), ..SharedRequest::default() },
            ..CreateEnvironment::default()
        }
    }

    /// Seed 003 §15.1, one row per condition: only a small request that asks is shared.
    #[test]
    fn eligibility_follows_the_rules_table() {
        type Edit = fn(&mut CreateEnvironment, &mut SharedSettings);
        let table: &[(&str, Edit, Option<&str>)] = &[
            ("small and asked", |_, _| {}, None),
            ("asked as shared", |r, _| r.shared.asked = Some("shared"), None),
            ("shared-small class", |r, _| r.shared.resource_class = Some("shared-small".into()), None),
            ("auto policy", |r, _| r.shared.backend_policy = Some("auto".into()), None),
            ("inputs at the bound", |r, _| (r.shared.input_bytes, r.input_objects) = (10 << 20, 100), None),
            ("not asked", |r, _| r.shared.asked = None, Some("-")),
            ("disabled", |_, s| s.per_user = 0, Some("shared compute is off")),
            ("network", |_, s| s.no_network = false, Some("network")),
            ("no runtime named", |r, _| r.max_runtime_seconds = None, Some("max runtime")),
            ("runtime too long", |r, _| r.max_runtime_seconds = Some(61), Some("max runtime")),
            ("inputs too big", |r, _| r.shared.input_bytes = (10 << 20) + 1, Some("input_objects above")),
            ("input limit too big", |r, _| r.shared.max_input_bytes = Some(11 << 20), Some("input_objects above")),
            ("too many inputs", |r, _| r.input_objects = 101, Some("max_files")),
            ("too many files", |r, _| r.options.max_artifact_files = Some(101), Some("max_files")),
            ("big outputs", |r, _| r.options.max_artifact_bytes = Some(11 << 20), Some("max_output_bytes")),
            ("big stdout", |r, _| r.options.max_output_bytes = Some(2 << 20), Some("max_stdout_stderr")),
            ("gpu", |r, _| r.shared.resource_class = Some("gpu".into()), Some("resource_class")),
            ("dedicated policy", |r, _| r.shared.backend_policy = Some("dedicated".into()), Some("backend_policy")),
        ];
        for (name, edit, refused) in table {
            let (mut req, mut s) = (small(), settings());
            edit(&mut req, &mut s);
            let got = decide(&s, &req);
            match refused {
                None => assert!(matches!(got, Decision::Shared(_)), "{name}: {got:?}"),
                Some("-") => assert_eq!(got, Decision::Standard(None), "{name}"),
                Some(why) => match got {
                    Decision::Standard(Some(r)) => assert!(r.contains(why), "{name}: {r}"),
                    other => panic!("{name}: {other:?}"),
                },
            }
        }
        let shared = shared_request(&settings(), &small(), "simple");
        assert_eq!(shared.options.max_output_bytes, Some(1 << 20), "the shared caps apply by default");
        assert_eq!(shared.options.max_artifact_files, Some(100));
        assert_eq!(shared.options.execution_mode.as_deref(), Some("simple"));
    }

    fn spec(scope: &str, env: &str) -> ContainerSpec {
        ContainerSpec {
            deployment_id: "d".into(),
            scope_id: scope.into(),
            owner_id: format!("o-{env}"),
            environment_id: env.into(),
            workspace: format!("/mnt/{scope}").into(),
            read_only_workspace: false,
            views: Vec::new(),
        }
    }

    /// Warm containers are only found by the same user and the same mounts, at most `per_user`
    /// stay warm per user, and idle ones expire.
    #[test]
    fn the_pool_keys_by_user_and_mounts_and_bounds_warm_containers() {
        let pool = SharedPool::new(settings());
        let t0 = Instant::now();
        let k = |u: &str, s: &str| PoolKey::of(u, &spec(s, "e"));
        assert_eq!(PoolKey::of("u1", &spec("s1", "e1")), PoolKey::of("u1", &spec("s1", "e2")));
        let slot = pool.reserve("u1", None).unwrap();
        pool.lease("e1", k("u1", "s1"), "c1", slot);
        assert!(matches!(pool.reserve("u1", Some(1)), Err(ComputeError::TooMany(_))), "the request's own bound");
        let _second = pool.reserve("u1", Some(2)).unwrap();
        assert!(matches!(pool.reserve("u1", None), Err(ComputeError::TooMany(_))), "a third shared lease is refused");
        assert!(matches!(pool.reserve("u1", Some(9)), Err(ComputeError::TooMany(_))), "never above per_user");
        assert!(pool.reserve("u2", Some(1)).is_ok(), "another user has its own slots");
        let (key, c) = pool.release("e1").unwrap();
        assert!(pool.park(key.expect("a lease made by create is reusable"), c, t0).is_empty());
        assert!(pool.holds("c1"));
        assert_eq!(pool.take_idle(&k("u2", "s1")), None, "another user never gets it");
        assert_eq!(pool.take_idle(&k("u1", "s2")), None, "nor another scope");
        let mut ro = k("u1", "s1");
        ro.spec.read_only_workspace = true;
        assert_eq!(pool.take_idle(&ro), None, "nor other mount options");
        assert_eq!(pool.take_idle(&k("u1", "s1")).as_deref(), Some("c1"));
        for (i, c) in ["c1", "c2"].iter().enumerate() {
            assert!(pool.park(k("u1", "s1"), c.to_string(), t0 + Duration::from_secs(i as u64)).is_empty());
        }
        assert_eq!(pool.park(k("u1", "s2"), "c3".into(), t0), vec!["c1".to_string()], "the oldest goes");
        assert_eq!(pool.counts("u1"), (2, 0));
        assert!(pool.expired(t0 + Duration::from_secs(119)).is_empty());
        let mut gone = pool.expired(t0 + Duration::from_secs(121));
        gone.sort();
        assert_eq!(gone, vec!["c2".to_string(), "c3".to_string()]);
        assert!(!pool.holds("c2"));
    }
}
