//! The container policy of SPEC §8 (from `[executor]`) and the checks of strict mode.
//!
//! Every sandbox container gets: the scope's mountpoint at `/workspace` (read-only for memory
//! workers), plus the binds of other scopes of the user the request granted
//! (`ContainerSpec::views`: `/threads/{thread_id}` read-only, `/__global__` read-write only when
//! granted so), the configured network (`none` by default), all capabilities
//! dropped, `no-new-privileges`, a read-only root filesystem with a tmpfs `/tmp`, memory (no
//! swap), CPU and pids limits, the configured non-root user, private PID and IPC namespaces, an
//! init process, no Docker socket, and the deployment's labels. `weaknesses` lists what a
//! configuration gives up; strict mode (`isolation = "required"`) refuses to start with any of
//! them, optional mode logs them.

use scopefs::config::ExecutorConfig;

/// The container policy the Docker executor applies to every environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPolicy {
    pub image: String,
    pub user: String,
    pub memory_bytes: i64,
    pub nano_cpus: i64,
    pub pids_limit: i64,
    pub tmp_bytes: u64,
    pub network: String,
}

impl ContainerPolicy {
    pub fn from_config(cfg: &ExecutorConfig) -> ContainerPolicy {
        let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        ContainerPolicy {
            image: cfg.image.clone(),
            user: cfg.user.clone(),
            memory_bytes: signed(cfg.memory_bytes),
            nano_cpus: signed(cfg.nano_cpus),
            pids_limit: signed(cfg.pids_limit),
            tmp_bytes: cfg.tmp_bytes,
            network: cfg.network.clone(),
        }
    }

    /// Mount options of the tmpfs at `/tmp`.
    pub fn tmpfs_options(&self) -> String {
        let size = if self.tmp_bytes > 0 { format!(",size={}", self.tmp_bytes) } else { String::new() };
        format!("rw,nosuid,nodev,mode=1777{size}")
    }
}

/// Whether `image` is pinned by content: `name@sha256:<64 hex>` or an image id `sha256:<64 hex>`.
pub fn image_is_pinned(image: &str) -> bool {
    let digest = match image.rsplit_once('@') {
        Some((name, digest)) if !name.is_empty() => digest,
        Some(_) => return false,
        None => image,
    };
    digest.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `uid:gid` with numeric, non-zero ids. Names are refused because they cannot be checked before
/// the image resolves them; a bare uid is refused because Docker would then take the group from
/// the image's passwd entry, or 0.
fn user_problem(user: &str) -> Option<String> {
    let Some((uid, gid)) = parse_user(user) else {
        return Some(format!("executor.user = {user:?} must be a numeric uid:gid so that non-root can be verified"));
    };
    if uid == 0 || gid == 0 {
        return Some(format!("executor.user = {user:?} runs as root (uid or gid 0)"));
    }
    None
}

/// `uid:gid` of `executor.user`, both numeric (u32); anything else (a name, a bare uid) is `None`.
pub fn parse_user(user: &str) -> Option<(u32, u32)> {
    let (uid, gid) = user.split_once(':')?;
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !numeric(uid) || !numeric(gid) {
        return None;
    }
    Some((uid.parse().ok()?, gid.parse().ok()?))
}

/// The sandbox uid must not be a host account's (review M6): a host user with the same uid could
/// read and write every running scope through `/proc/<pid>/cwd` of the sandbox processes.
/// `passwd` is the text of the host's `/etc/passwd`.
fn host_account_problem(user: &str, passwd: &str) -> Option<String> {
    let (uid, _) = parse_user(user)?;
    let name = passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        let name = f.next()?;
        (f.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_string())
    })?;
    Some(format!(
        "executor.user = {user:?}: uid {uid} is the host account {name:?}, which could reach the sandboxes' \
         files through /proc (use a uid with no host account, e.g. the default 2000000000:2000000000)"
    ))
}

/// Everything in `cfg` that weakens the container policy, each naming its key (the sandbox uid is
/// checked against this host's `/etc/passwd`).
pub fn weaknesses(cfg: &ExecutorConfig) -> Vec<String> {
    weaknesses_on_host(cfg, &std::fs::read_to_string("/etc/passwd").unwrap_or_default())
}

/// [`weaknesses`] with the host's `/etc/passwd` text given.
fn weaknesses_on_host(cfg: &ExecutorConfig, passwd: &str) -> Vec<String> {
    let mut out = Vec::new();
    if !image_is_pinned(&cfg.image) {
        out.push(format!(
            "executor.image = {:?} is not pinned by digest (use name@sha256:<digest> or the image id sha256:<digest>)",
            cfg.image
        ));
    }
    if let Some(p) = user_problem(&cfg.user).or_else(|| host_account_problem(&cfg.user, passwd)) {
        out.push(p);
    }
    if cfg.network != "none" {
        out.push(format!("executor.network = {:?} gives containers a network (must be \"none\")", cfg.network));
    }
    if cfg.memory_bytes == 0 {
        out.push("executor.memory_bytes = 0 leaves memory unlimited".into());
    }
    if cfg.nano_cpus == 0 {
        out.push("executor.nano_cpus = 0 leaves CPU unlimited".into());
    }
    if cfg.pids_limit == 0 {
        out.push("executor.pids_limit = 0 leaves the number of processes unlimited".into());
    }
    if cfg.tmp_bytes == 0 {
        out.push("executor.tmp_bytes = 0 leaves the /tmp tmpfs unbounded".into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_images() {
        let hex = "a".repeat(64);
        assert!(image_is_pinned(&format!("sandbox@sha256:{hex}")));
        assert!(image_is_pinned(&format!("reg.example:5000/a/b:1@sha256:{hex}")));
        assert!(image_is_pinned(&format!("sha256:{hex}")));
        assert!(!image_is_pinned("sandbox:latest"));
        assert!(!image_is_pinned(&format!("@sha256:{hex}")));
        assert!(!image_is_pinned("sandbox@sha256:abc"));
        assert!(!image_is_pinned(&format!("sandbox@sha512:{hex}")));
    }

    #[test]
    fn each_weak_setting_is_named() {
        let strong = ExecutorConfig { image: format!("s@sha256:{}", "0".repeat(64)), ..ExecutorConfig::default() };
        assert_eq!(weaknesses(&strong), Vec::<String>::new());
        let cases: Vec<(ExecutorConfig, &str)> = vec![
            (ExecutorConfig { image: "s:1".into(), ..strong.clone() }, "executor.image"),
            (ExecutorConfig { user: "0:0".into(), ..strong.clone() }, "root"),
            (ExecutorConfig { user: "1000:0".into(), ..strong.clone() }, "root"),
            (ExecutorConfig { user: "agent".into(), ..strong.clone() }, "numeric"),
            (ExecutorConfig { user: "1000".into(), ..strong.clone() }, "numeric uid:gid"),
            (ExecutorConfig { user: "1000:".into(), ..strong.clone() }, "numeric uid:gid"),
            (ExecutorConfig { network: "bridge".into(), ..strong.clone() }, "executor.network"),
            (ExecutorConfig { memory_bytes: 0, ..strong.clone() }, "executor.memory_bytes"),
            (ExecutorConfig { nano_cpus: 0, ..strong.clone() }, "executor.nano_cpus"),
            (ExecutorConfig { pids_limit: 0, ..strong.clone() }, "executor.pids_limit"),
            (ExecutorConfig { tmp_bytes: 0, ..strong.clone() }, "executor.tmp_bytes"),
        ];
        for (cfg, needle) in cases {
            let w = weaknesses(&cfg);
            assert_eq!(w.len(), 1, "{w:?}");
            assert!(w[0].contains(needle), "{w:?} should mention {needle}");
        }
    }

    #[test]
    fn a_bare_uid_is_not_a_user() {
        assert_eq!(parse_user("1000"), None);
        assert_eq!(parse_user("1000:x"), None);
        assert_eq!(parse_user("2000000000:2000000000"), Some((2_000_000_000, 2_000_000_000)));
    }

    #[test]
    fn a_sandbox_uid_of_a_host_account_is_a_weakness() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000:Alice:/home/alice:/bin/bash\n";
        let strong = ExecutorConfig { image: format!("s@sha256:{}", "0".repeat(64)), ..ExecutorConfig::default() };
        assert_eq!(strong.user, "2000000000:2000000000", "the default uid has no host account");
        assert_eq!(weaknesses_on_host(&strong, passwd), Vec::<String>::new());
        let host = ExecutorConfig { user: "1000:1000".into(), ..strong.clone() };
        let w = weaknesses_on_host(&host, passwd);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("host account \"alice\""), "{w:?}");
        // The real host: the default uid must not be one of its accounts.
        assert_eq!(weaknesses(&strong), Vec::<String>::new());
    }
}
