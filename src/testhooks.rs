//! Test hooks: crash failpoints, the offset-file test clock and the FUSE stall marker, honoured only
//! when the cargo feature `test-hooks` is on.
//!
//! The test builds turn the feature on (the workspace crates list `scopefs` with `test-hooks` among
//! their dev-dependencies, so `cargo test` and `cargo clippy --all-targets` build the daemon binary
//! with it); `cargo build --release` (the Debian package) does not, and then every hook here is a
//! no-op: whoever can set the daemon's environment or write a clock file can neither abort it nor
//! move its clock (and so its signature window). The variable names stay defined either way, so
//! the configuration's `SCOPEFS_*` overlay can recognise them.

use std::ffi::OsString;
use std::sync::Arc;

use crate::clock::Clock;

/// Variable naming a failpoint at which the process aborts (tests of crash recovery).
pub const FAILPOINT_ENV: &str = "SCOPEFS_FAILPOINT";
/// Variable naming a file with a clock offset in seconds for the registry clock (tests of expiry,
/// retention, leases and signature windows).
pub const CLOCK_FILE_ENV: &str = "SCOPEFS_TEST_CLOCK_FILE";
/// Variable naming a marker file that makes a FUSE lookup of `stall-me` hang (restart tests).
pub const FUSE_STALL_ENV: &str = "SCOPEFS_TEST_FUSE_STALL";
/// Every variable read by a test hook.
pub const ENV_NAMES: [&str; 3] = [FAILPOINT_ENV, CLOCK_FILE_ENV, FUSE_STALL_ENV];

/// Whether this build honours the test hooks (the cargo feature `test-hooks`).
pub const ENABLED: bool = cfg!(feature = "test-hooks");

/// A non-empty value of `var`, when the hooks are enabled.
fn hook_var(var: &str) -> Option<OsString> {
    if !ENABLED {
        return None;
    }
    std::env::var_os(var).filter(|v| !v.is_empty())
}

/// Aborts the process (like `kill -9`: no cleanup) when `SCOPEFS_FAILPOINT` equals `name`.
/// Without that variable, or without the feature, this does nothing.
pub fn failpoint(name: &str) {
    failpoint_then(name, || {})
}

/// Like [`failpoint`], but runs `before_abort` just before aborting (the daemon's worker kills its
/// supervisor there, so that the whole service crashes as a crash test means).
pub fn failpoint_then(name: &str, before_abort: impl FnOnce()) {
    if !ENABLED {
        return;
    }
    static ARMED: std::sync::OnceLock<Option<OsString>> = std::sync::OnceLock::new();
    let armed = ARMED.get_or_init(|| hook_var(FAILPOINT_ENV));
    if armed.as_deref().is_some_and(|armed| armed == name) {
        eprintln!("scopefs: failpoint {name} reached; aborting");
        before_abort();
        std::process::abort();
    }
}

/// The registry clock to use instead of the system clock: an offset-file clock when
/// `SCOPEFS_TEST_CLOCK_FILE` names a file (logged loudly), otherwise (or without the feature) none.
pub fn test_clock() -> Option<Arc<dyn Clock>> {
    let path = hook_var(CLOCK_FILE_ENV)?;
    tracing::warn!("{CLOCK_FILE_ENV} is set: the registry clock is shifted by the offset in that file (tests only)");
    offset_file_clock(path)
}

#[cfg(feature = "test-hooks")]
fn offset_file_clock(path: OsString) -> Option<Arc<dyn Clock>> {
    Some(Arc::new(crate::clock::OffsetFileClock::new(path.into())))
}

#[cfg(not(feature = "test-hooks"))]
fn offset_file_clock(_path: OsString) -> Option<Arc<dyn Clock>> {
    None
}

#[cfg(feature = "test-hooks")]
thread_local! {
    static BOOT: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` as if the host had booted as `id` (crash tests open a power loss's image as the next
/// boot would); test builds only.
#[cfg(feature = "test-hooks")]
pub fn with_boot<T>(id: u64, f: impl FnOnce() -> T) -> T {
    let before = BOOT.with(|b| b.replace(Some(id)));
    let out = f();
    BOOT.with(|b| b.set(before));
    out
}

/// The boot this thread pretends to run in (`with_boot`); `None` without the feature.
pub fn boot_override() -> Option<u64> {
    #[cfg(feature = "test-hooks")]
    {
        BOOT.with(|b| b.get())
    }
    #[cfg(not(feature = "test-hooks"))]
    {
        None
    }
}

/// An action a test put at a named point of one scope's operations (`set_interleave`).
#[cfg(feature = "test-hooks")]
type Interleaved = std::sync::Arc<dyn Fn() + Send + Sync>;

#[cfg(feature = "test-hooks")]
static INTERLEAVED: parking_lot::Mutex<Vec<(&'static str, String, Interleaved)>> = parking_lot::Mutex::new(Vec::new());

/// Runs what a test installed at `point` of scope `scope`'s operations (test builds only), so a
/// test puts another actor's whole critical section exactly between two steps of an operation
/// (the interleavings of online gc, `tests/engine_gc.rs`). Without the feature this does nothing.
pub fn interleave(point: &str, scope: &str) {
    #[cfg(feature = "test-hooks")]
    {
        let found = INTERLEAVED.lock().iter().find(|(p, s, _)| *p == point && s == scope).map(|(_, _, f)| f.clone());
        if let Some(action) = found {
            action();
        }
    }
    #[cfg(not(feature = "test-hooks"))]
    let _ = (point, scope);
}

/// Installs `action` at `point` of scope `scope` until the returned guard is dropped (test builds).
#[cfg(feature = "test-hooks")]
pub fn set_interleave(point: &'static str, scope: &str, action: impl Fn() + Send + Sync + 'static) -> Interleaving {
    INTERLEAVED.lock().push((point, scope.to_string(), std::sync::Arc::new(action)));
    Interleaving { point, scope: scope.to_string() }
}

/// Removes an installed interleaving when dropped.
#[cfg(feature = "test-hooks")]
pub struct Interleaving {
    point: &'static str,
    scope: String,
}

#[cfg(feature = "test-hooks")]
impl Drop for Interleaving {
    fn drop(&mut self) {
        INTERLEAVED.lock().retain(|(p, s, _)| !(*p == self.point && *s == self.scope));
    }
}

/// The marker file of the FUSE stall hook (`SCOPEFS_TEST_FUSE_STALL`), when set and enabled.
pub fn fuse_stall_marker() -> Option<OsString> {
    hook_var(FUSE_STALL_ENV)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unarmed_failpoint_returns() {
        // SCOPEFS_FAILPOINT is not set for unit tests: reaching a failpoint does nothing.
        assert!(std::env::var_os(FAILPOINT_ENV).is_none(), "{FAILPOINT_ENV} must not be set for unit tests");
        let mut ran = false;
        failpoint_then("never-armed", || ran = true);
        assert!(!ran);
    }

    #[test]
    fn test_builds_enable_the_hooks() {
        // The crate's own dev-dependency on itself turns the feature on for every test build.
        assert!(std::hint::black_box(ENABLED), "cargo test must build scopefs with the test-hooks feature");
    }

    #[test]
    fn env_names_are_distinct_scopefs_variables() {
        for (i, a) in ENV_NAMES.iter().enumerate() {
            assert!(a.starts_with("SCOPEFS_"), "{a}");
            assert!(ENV_NAMES[i + 1..].iter().all(|b| b != a), "{a} listed twice");
        }
    }
}
