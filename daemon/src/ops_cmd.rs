//! Operator commands without a running daemon: `serve --print-config`, `fsck`, `gc`, `token show|rotate`, `import`
//! (`fsck`, `gc` and `import` refuse while a daemon runs on the data directory: `open_offline`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use scopefs::config::{Config, StoreConfig};
use scopefs::engine::{ScopeEngine, Storage, WriteMode};
use scopefs::ids::{ScopeId, ThreadId};
use scopefs::registry::DeploymentRegistry;

use crate::datadir_lock::DataDirLock;
use crate::{setup, tokens};

/// What replaces every secret in printed configuration.
pub const REDACTED: &str = "<redacted>";

/// The configuration with tokens, the HMAC secret and the S3 secret key replaced by `<redacted>`.
pub fn redacted(cfg: &Config) -> Config {
    let mut cfg = cfg.clone();
    let hide = |v: &mut Option<String>| {
        if v.is_some() {
            *v = Some(REDACTED.to_string());
        }
    };
    hide(&mut cfg.service_token);
    hide(&mut cfg.admin_token);
    hide(&mut cfg.hmac_secret);
    if let StoreConfig::S3 { secret_access_key, .. } = &mut cfg.store {
        hide(secret_access_key);
    }
    // The URL may carry a password.
    hide(&mut cfg.registry.url);
    cfg
}

/// The effective configuration as TOML, secrets redacted.
pub fn print_config(cfg: &Config) -> anyhow::Result<()> {
    let text = toml::to_string(&redacted(cfg)).context("rendering the configuration as TOML")?;
    print!("{text}");
    print!("{}", crate::memory_bound::MemoryBound::of(cfg).render());
    Ok(())
}

/// Registry, storage and runtime for commands that work on scopes without a running daemon,
/// holding the data directory's lock (`datadir_lock`) while they run.
pub(crate) struct Offline {
    pub(crate) registry: DeploymentRegistry,
    pub(crate) storage: Arc<Storage>,
    // Kept alive for the storage's object-store requests.
    _rt: tokio::runtime::Runtime,
    // Dropped last: nothing of the data directory is open once it goes.
    _lock: DataDirLock,
}

/// The registry alone (its control directory prepared).
pub(crate) fn open_registry(cfg: &Config) -> anyhow::Result<DeploymentRegistry> {
    setup::control_dir(cfg).context("preparing the control directory")?;
    let registry = setup::open_registry(cfg)?;
    Ok(std::sync::Arc::new(registry).deployment(&cfg.deployment_id))
}

/// The registry, the object store and local storage, on a runtime of their own, for the offline
/// command `name`. Refuses while a daemon (or another such command) runs on the data directory:
/// it would delete the daemon's working files and race its metadata (review D8).
pub(crate) fn open_offline(cfg: &Config, name: &str) -> anyhow::Result<Offline> {
    let lock = crate::datadir_lock::for_command(&cfg.data_dir, name)?;
    let registry = open_registry(cfg)?;
    let rt = setup::runtime()?;
    let store = {
        let _in_runtime = rt.enter();
        setup::build_store(cfg).context("configuring the object store")?
    };
    let storage = Storage::new(store, cfg.storage_settings(), &cfg.data_dir, rt.handle().clone())
        .context("opening local storage")?;
    // gc keeps the blocks forks and snapshots share, and lets go of those it shared.
    storage.set_shared_blocks(Arc::new(crate::services::forks::RegistryHolds(registry.clone())));
    Ok(Offline { registry, storage, _rt: rt, _lock: lock })
}

impl Offline {
    fn engine(&self, cfg: &Config, scope: &str) -> anyhow::Result<Arc<ScopeEngine>> {
        let id = ScopeId::parse(scope).context("invalid scope id")?;
        let Some(rec) = self.registry.get(&id).context("reading the registry")? else {
            bail!("no scope {id} in deployment {}", cfg.deployment_id);
        };
        if !rec.state.is_mountable() {
            bail!("scope {id} is {}; only draft and active scopes can be opened", rec.state);
        }
        self.storage.open_scope(&id, rec.quota_or(cfg.default_quota())).context("opening the scope's filesystem")
    }
}

/// `scopefs fsck SCOPE [--repair]`: checks every block of the scope; `Ok(false)` when damage was found.
///
/// Damaged files are reported by virtual path (reads of them fail, they never return other
/// bytes); `--repair` also deletes orphan objects. Refuses while a daemon runs (`open_offline`).
pub fn fsck(cfg: &Config, scope: &str, repair: bool) -> anyhow::Result<bool> {
    if repair {
        refuse_on_a_node(cfg, "fsck --repair")?;
    }
    let offline = open_offline(cfg, "fsck")?;
    let engine = offline.engine(cfg, scope)?;
    let report = engine.fsck(repair).context("fsck")?;
    println!("scope {scope}: {} files, {} blocks checked", report.files_checked, report.blocks_checked);
    for path in &report.damaged_files {
        println!("DAMAGED {path}: a block is missing or corrupt; reads of this file fail");
    }
    for key in &report.orphan_objects {
        let id = key.rsplit('/').next().unwrap_or_default();
        let action = if repair { "deleted" } else { "found (delete with --repair)" };
        println!("ORPHAN block {id}: {action}");
    }
    for key in &report.pending_deletes {
        let id = key.rsplit('/').next().unwrap_or_default();
        let action = if repair { "deleted" } else { "left by an interrupted gc pass (the next one deletes it)" };
        println!("PENDING-DELETE block {id}: {action}");
    }
    for problem in &report.metadata_problems {
        println!("METADATA {problem}");
    }
    let clean = report.damaged_files.is_empty() && report.metadata_problems.is_empty();
    let orphans_left = !repair && !report.orphan_objects.is_empty();
    println!(
        "{}: {} damaged files, {} orphan objects, {} metadata problems",
        if clean && !orphans_left { "clean" } else { "problems found" },
        report.damaged_files.len(),
        report.orphan_objects.len(),
        report.metadata_problems.len()
    );
    Ok(clean && !orphans_left)
}

/// Refuses a command that deletes or writes from this data directory's copy of a scope when the
/// daemon is one node of several: with this node's daemon stopped, its lease runs out and another
/// node may take the scope over while the command runs, and the copy may be behind or ahead of
/// the state the registry recorded; gc (or an orphan sweep) from it could delete blocks the
/// scope's owner refers to. With several nodes, gc runs online in the serving daemon.
fn refuse_on_a_node(cfg: &Config, what: &str) -> anyhow::Result<()> {
    if cfg.node.id.is_some() {
        bail!(
            "`scopefs {what}` is refused on a node of several: another node may serve the scope by now, and \
             this data directory's copy of it is not the scope's state (gc runs online in the serving daemon; \
             read-only `scopefs fsck SCOPE` works)"
        );
    }
    Ok(())
}

/// `scopefs gc SCOPE`: deletes blocks no file refers to any more (older than `grace`).
pub fn gc(cfg: &Config, scope: &str, grace: Duration) -> anyhow::Result<()> {
    refuse_on_a_node(cfg, "gc")?;
    let offline = open_offline(cfg, "gc")?;
    let engine = offline.engine(cfg, scope)?;
    let report = engine.collect_garbage(grace).context("garbage collection")?;
    println!("scope {scope}: {} blocks deleted, {} bytes freed", report.blocks_deleted, report.bytes_deleted);
    Ok(())
}

/// The token files `token show|rotate` manage.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum TokenKind {
    Service,
    Admin,
    Hmac,
}

impl TokenKind {
    fn file(self) -> &'static str {
        match self {
            TokenKind::Service => "service-token",
            TokenKind::Admin => "admin-token",
            TokenKind::Hmac => "hmac-secret",
        }
    }

    fn configured(self, cfg: &Config) -> Option<&str> {
        match self {
            TokenKind::Service => cfg.service_token.as_deref(),
            TokenKind::Admin => cfg.admin_token.as_deref(),
            TokenKind::Hmac => cfg.hmac_secret.as_deref(),
        }
        .filter(|s| !s.trim().is_empty())
    }
}

fn token_path(cfg: &Config, kind: TokenKind) -> anyhow::Result<PathBuf> {
    Ok(setup::control_dir(cfg).context("preparing the control directory")?.join(kind.file()))
}

/// `scopefs token show`: prints the secret (generating it like the daemon would if absent).
pub fn token_show(cfg: &Config, kind: TokenKind) -> anyhow::Result<()> {
    let token = tokens::load_or_generate(kind.configured(cfg), &token_path(cfg, kind)?).context("loading the token")?;
    println!("{}", token.expose());
    Ok(())
}

/// `scopefs token rotate`: replaces the generated secret file; the daemon picks it up on restart.
pub fn token_rotate(cfg: &Config, kind: TokenKind) -> anyhow::Result<()> {
    if kind.configured(cfg).is_some() {
        bail!("the {} is set in the configuration; change it there instead", kind.file());
    }
    let path = token_path(cfg, kind)?;
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context("removing the old token file"),
    }
    let token = tokens::load_or_generate(None, &path).context("generating the new token")?;
    println!("{}", token.expose());
    eprintln!("scopefs: {} rotated; restart the daemon (systemctl restart scopefs) to use it", kind.file());
    Ok(())
}

/// `scopefs import DIR --thread T`: copies a directory tree into the thread's scope (creating the
/// scope if needed), with a progress bar on stderr. Symlinks and special files are skipped.
pub fn import(cfg: &Config, dir: &Path, thread: &str) -> anyhow::Result<()> {
    let thread = ThreadId::parse(thread).context("invalid --thread")?;
    refuse_on_a_node(cfg, "import")?;
    let offline = open_offline(cfg, "import")?;
    let rec = match offline.registry.find_by_thread(&thread).context("reading the registry")? {
        Some(rec) => rec,
        None => {
            crate::services::scopes::create_unmounted(cfg.default_quota(), &offline.registry, &offline.storage, &thread)
                .context("creating the scope")?
        }
    };
    let engine = offline.engine(cfg, rec.scope_id.as_str())?;
    let files = collect_files(dir)?;
    let total: u64 = files.iter().map(|(_, _, len)| len).sum();
    let mut done = 0u64;
    let mut progress = Progress::new(total, files.len());
    for (i, (_, rel, len)) in files.iter().enumerate() {
        let mut file = open_source(dir, rel).with_context(|| format!("opening source file {rel}"))?;
        crate::services::files::write_creating_parents(&engine, rel, &mut file, u64::MAX, WriteMode::Replace)
            .with_context(|| format!("writing /{rel}"))?;
        done += len;
        progress.update(i + 1, done);
    }
    if !engine.wait_uploads(Duration::from_secs(600)) {
        bail!("uploads of the imported files did not finish within 10 minutes (they stay journaled)");
    }
    progress.finish();
    println!("imported {} files ({} bytes) into scope {}", files.len(), total, rec.scope_id);
    Ok(())
}

/// Opens the collected source file `rel` below `root` again, following no symlink on the way
/// (review L6): a directory or file swapped for a link after the collection is refused, never read.
fn open_source(root: &Path, rel: &str) -> anyhow::Result<std::fs::File> {
    scopefs::vpath::open_regular_beneath(root, rel).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow::anyhow!("it is no longer a regular file below the source directory (changed during the import?)")
        } else {
            anyhow::Error::new(e)
        }
    })
}

/// Regular files under `root`: (source path, relative virtual path, length), sorted.
fn collect_files(root: &Path) -> anyhow::Result<Vec<(PathBuf, String, u64)>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).context("reading the source directory")? {
            let entry = entry.context("reading the source directory")?;
            let ty = entry.file_type().context("reading a source entry")?;
            let path = entry.path();
            if ty.is_dir() {
                stack.push(path);
            } else if ty.is_file() {
                let rel = path
                    .strip_prefix(root)
                    .ok()
                    .and_then(|p| p.to_str())
                    .context("a source file name is not UTF-8")?
                    .to_string();
                let len = entry.metadata().context("reading a source entry")?.len();
                out.push((path, rel, len));
            }
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(out)
}

/// A one-line progress bar on stderr.
struct Progress {
    total_bytes: u64,
    total_files: usize,
}

impl Progress {
    fn new(total_bytes: u64, total_files: usize) -> Progress {
        Progress { total_bytes, total_files }
    }

    fn update(&mut self, files: usize, bytes: u64) {
        const WIDTH: u64 = 30;
        let filled = (bytes.saturating_mul(WIDTH)).checked_div(self.total_bytes).unwrap_or(WIDTH).min(WIDTH);
        let bar: String = (0..WIDTH).map(|i| if i < filled { '#' } else { '-' }).collect();
        let mut err = std::io::stderr();
        let _ = write!(err, "\r[{bar}] {files}/{} files, {bytes}/{} bytes", self.total_files, self.total_bytes);
        let _ = err.flush();
    }

    fn finish(&mut self) {
        eprintln!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn print_config_redacts_every_secret_and_round_trips() {
        let mut cfg = Config {
            service_token: Some("svc-secret".into()),
            admin_token: Some("adm-secret".into()),
            hmac_secret: Some("hmac-secret-value".into()),
            ..Config::default()
        };
        cfg.store = StoreConfig::S3 {
            endpoint: Some("http://127.0.0.1:3900".into()),
            region: "garage".into(),
            bucket: "b".into(),
            prefix: String::new(),
            path_style: true,
            access_key_id: Some("GKkey".into()),
            secret_access_key: Some("s3-secret".into()),
        };
        let text = toml::to_string(&redacted(&cfg)).unwrap();
        for secret in ["svc-secret", "adm-secret", "hmac-secret-value", "s3-secret"] {
            assert!(!text.contains(secret), "{secret} leaked:\n{text}");
        }
        assert_eq!(text.matches(REDACTED).count(), 4, "{text}");
        // The printed form is itself a valid configuration.
        let back = Config::from_toml(&text).unwrap();
        assert_eq!(back.listen, cfg.listen);
        assert_eq!(back.pricing, cfg.pricing);
    }

    #[test]
    fn a_source_swapped_for_a_symlink_after_collection_is_not_read() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, outside) = (tmp.path().join("legacy"), tmp.path().join("outside"));
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("sub/a.txt"), b"legacy").unwrap();
        std::fs::write(root.join("top.txt"), b"top").unwrap();
        std::fs::write(outside.join("a.txt"), b"host secret").unwrap();
        std::fs::write(outside.join("target.txt"), b"host secret").unwrap();
        let files = collect_files(&root).unwrap();
        let rels: Vec<&str> = files.iter().map(|(_, rel, _)| rel.as_str()).collect();
        assert_eq!(rels, ["sub/a.txt", "top.txt"]);
        // Between collection and copy, a directory and a file become links to host files.
        std::fs::remove_dir_all(root.join("sub")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("sub")).unwrap();
        std::fs::remove_file(root.join("top.txt")).unwrap();
        std::os::unix::fs::symlink(outside.join("target.txt"), root.join("top.txt")).unwrap();
        for rel in rels {
            let err = open_source(&root, rel).unwrap_err().to_string();
            assert!(err.contains("no longer a regular file"), "{rel}: {err}");
        }
        // An unchanged file still opens.
        std::fs::write(root.join("plain.txt"), b"x").unwrap();
        assert!(open_source(&root, "plain.txt").is_ok());
    }

    #[test]
    fn shipped_default_config_parses_and_matches_the_defaults() {
        let text = include_str!("../../packaging/scopefs.toml");
        let cfg = Config::from_toml(text).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg, Config::default());
    }

    /// With several nodes, the offline commands that delete or write from the local copy refuse
    /// before they open anything; the read-only fsck is not refused by this rule.
    #[test]
    fn a_node_of_several_refuses_offline_changes() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config { data_dir: dir.path().to_path_buf(), ..Config::default() };
        cfg.node.id = Some("node-1".into());
        let refusals = [
            gc(&cfg, "some-scope", Duration::ZERO).unwrap_err(),
            fsck(&cfg, "some-scope", true).unwrap_err(),
            import(&cfg, dir.path(), "some-thread").unwrap_err(),
        ];
        for e in refusals {
            assert!(e.to_string().contains("refused on a node of several"), "{e:#}");
        }
        let read_only = fsck(&cfg, "some-scope", false).unwrap_err();
        assert!(!read_only.to_string().contains("refused on a node of several"), "{read_only:#}");
    }
}
