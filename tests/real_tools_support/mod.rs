//! The rig of the real-tool suite: a scope mounted as a container sees it (real mount bound at a traversable path, owned by the sandbox uid) and named steps that run real tools as that user.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use scopefs::engine::ScopeEngine;
use scopefs_fs::MountOptions;

use crate::harness::{big_quota, small_block_settings, BindMount, Harness};

/// The default sandbox user of the executor (`executor.user`): no host account, not root.
pub const UID: u32 = 2_000_000_000;
pub const GID: u32 = 2_000_000_000;

/// The PATH a container user has: system directories only (no root-owned toolchains in `~root`).
pub const USER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Wall-clock bound of one step, enforced by coreutils `timeout` so a hung mount fails the
/// step (with its name) instead of hanging the suite.
const STEP_TIMEOUT_SECS: &str = "600";

/// Shell prelude of every step: `-e` stops at the first failing command; `fail` names a check.
const PRELUDE: &str = "set -eu\nfail() { echo \"CHECK FAILED: $*\" >&2; exit 1; }\n";

/// One scope mounted for the sandbox user. Field order is drop order: the bind first.
pub struct Rig {
    bind: BindMount,
    /// A native (non-FUSE) directory owned by the user: reference copies and inputs.
    native: tempfile::TempDir,
    _engine: Arc<ScopeEngine>,
    _h: Harness,
}

impl Rig {
    /// Mounts a fresh scope, gives its root to the sandbox user (as the executor does) and binds
    /// the real mount at a path the user may traverse. `tools` are `(binary, Debian package)`
    /// pairs the steps need: a missing one fails the test naming the package to install.
    pub fn new(tools: &[(&str, &str)]) -> Rig {
        require(tools);
        let h = Harness::new(small_block_settings(), MountOptions::default());
        let (engine, _) = h.scope(big_quota());
        let real = h.mounts.real_mountpoint(engine.scope_id());
        std::os::unix::fs::chown(&real, Some(UID), Some(GID)).expect("chown the scope root to the sandbox user");
        let bind = BindMount::new(&real);
        let native = tempfile::tempdir().expect("native tempdir");
        std::os::unix::fs::chown(native.path(), Some(UID), Some(GID)).expect("chown the native dir");
        let rig = Rig { bind, native, _engine: engine, _h: h };
        // The steps really run as the sandbox user (no supplementary group) on the FUSE mount.
        rig.step(
            "prepare home and tmp",
            &format!(
                r#"
                [ "$(id -u):$(id -G)" = "{UID}:{GID}" ] || fail "running as $(id -u):$(id -G)"
                [ "$(stat -f -c %t .)" = 65735546 ] || fail "not a FUSE mount: type $(stat -f -c %t .)"
                mkdir home tmp work
                "#
            ),
        );
        rig
    }

    /// The scope as the user sees it (a bind of the real mount).
    pub fn mnt(&self) -> &Path {
        &self.bind.path
    }

    /// A directory on the host's own filesystem, owned by the user.
    pub fn native(&self) -> &Path {
        self.native.path()
    }

    /// Runs `script` with `sh` as the sandbox user in `<mnt>/work`; returns its stdout. A
    /// failure panics naming the step, with the exit status and the tools' stdout and stderr.
    pub fn step(&self, name: &str, script: &str) -> String {
        let mnt = self.mnt();
        let cwd = if mnt.join("work").is_dir() { mnt.join("work") } else { mnt.to_path_buf() };
        let mut cmd = Command::new("timeout");
        cmd.args(["-k", "10", STEP_TIMEOUT_SECS, "sh", "-c"])
            .arg(format!("{PRELUDE}{script}"))
            .current_dir(&cwd)
            .env_clear()
            .env("PATH", USER_PATH)
            .env("HOME", mnt.join("home"))
            .env("TMPDIR", mnt.join("tmp"))
            .env("LANG", "C.UTF-8")
            .env("MNT", mnt)
            .env("NATIVE", self.native())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "Real Tools")
            .env("GIT_AUTHOR_EMAIL", "real-tools@example.invalid")
            .env("GIT_COMMITTER_NAME", "Real Tools")
            .env("GIT_COMMITTER_EMAIL", "real-tools@example.invalid")
            .env("PIP_NO_CACHE_DIR", "1")
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            // std drops the supplementary groups when root switches uid.
            .uid(UID)
            .gid(GID);
        let out = cmd.output().unwrap_or_else(|e| panic!("step `{name}`: cannot start sh: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let timed_out = out.status.code() == Some(124) || out.status.code() == Some(137);
        assert!(
            out.status.success(),
            "step `{name}` failed ({}{}):\n--- stderr ---\n{}\n--- stdout ---\n{}",
            out.status,
            if timed_out { ", timed out" } else { "" },
            tail(&stderr),
            tail(&stdout)
        );
        stdout
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// Fails (never skips) when a tool is not on the user's PATH, naming the package.
pub fn require(tools: &[(&str, &str)]) {
    let dirs: Vec<PathBuf> = std::env::split_paths(USER_PATH).collect();
    for &(bin, package) in [("timeout", "coreutils"), ("sh", "dash")].iter().chain(tools) {
        let found = dirs.iter().any(|d| {
            let p = d.join(bin);
            std::fs::metadata(&p).map(|m| m.is_file()).unwrap_or(false)
        });
        assert!(
            found,
            "`{bin}` is not installed for the sandbox user (PATH {USER_PATH}): run scripts/install-deps.sh \
             (Debian package {package})"
        );
    }
}

/// Fails (never skips) when `python3` lacks a module, naming the Debian package that ships it.
pub fn require_python_modules(modules: &[(&str, &str)]) {
    for &(module, package) in modules {
        let ok = Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .env("PATH", USER_PATH)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        assert!(ok, "python3 has no `{module}` module: run scripts/install-deps.sh (Debian package {package})");
    }
}
