//! Outputs of an environment (seed 003 §3.8, §7.5): the regular files under its output paths,
//! walked through the scope's engine (never the host), become a bounded artifact manifest —
//! path, size, SHA-256 and a content type from the extension.
//!
//! An environment's outputs are the regular files under its output paths that it created or
//! changed: whose change time (`ctime`, set by the engine at every change of the file, never by a
//! program) is at or after the environment's creation. A file that was already there unchanged is
//! not an output, so the seed's default output path (`/workspace`) hashes only what the job made.
//!
//! Output paths are relative to `/workspace` (`/workspace/out`, `out`, `/workspace` itself) and
//! validated like file-tool paths, or name the user's global store (`/__global__`, `/__global__/…`:
//! seed 003 §7.3's default output paths name it). Files of the global store are outputs only of an
//! environment whose container had it read-write (`EnvironmentOptions::global_store_scope`); their
//! artifact paths are `/__global__/<path>`, the workspace's are scope paths. The walk refuses
//! (`limits.max_artifact_files`, `limits.max_artifact_bytes`, over both stores together) from the
//! listing, before any file is read.

use std::collections::BTreeMap;
use std::time::SystemTime;

use scopefs::engine::{FileKind, ScopeEngine};
use scopefs::ids::ScopeId;
use scopefs::limits::{refuse, Bound};
use scopefs::registry::billing::ArtifactEntry;
use sha2::{Digest, Sha256};

use super::{ComputeError, ComputeService, EnvironmentOptions};
use crate::services::peers::GLOBAL_ROOT;
use crate::services::ServiceError;

/// The container's view of the scope root.
pub const WORKSPACE: &str = "/workspace";

/// Bytes read per engine call while hashing.
const CHUNK: u64 = 1 << 20;

/// An output path (`/workspace/...`, `/workspace` or relative) as a scope path (`""`: the root).
pub fn output_path(raw: &str) -> Result<String, ComputeError> {
    let invalid = |e: String| ComputeError::Invalid("output_paths", e);
    let rel = if raw == WORKSPACE || raw == "/workspace/" {
        ""
    } else if let Some(rest) = raw.strip_prefix("/workspace/") {
        rest
    } else if raw.starts_with('/') {
        return Err(invalid(format!("{raw:?} is outside /workspace")));
    } else {
        raw
    };
    if rel.trim_matches('/').is_empty() || rel == "." {
        return Ok(String::new());
    }
    scopefs::vpath::normalize(rel).map_err(|e| invalid(format!("{raw:?}: {e}")))
}

/// The path below the user's global store that `raw` names (`""`: the store itself); `None`: not
/// a global-store path.
fn global_path(raw: &str) -> Option<String> {
    let rest = raw.trim_end_matches('/').strip_prefix(GLOBAL_ROOT)?;
    match rest.strip_prefix('/') {
        None if rest.is_empty() => Some(String::new()),
        None => None,
        Some(r) => scopefs::vpath::normalize(r).ok(),
    }
}

/// The stores outputs are read from: the environment's scope and, when its global store was
/// read-write and named, the user's global store; or the snapshots of them that keep the outputs
/// (`snapshots`: their ids, workspace then global).
#[derive(Debug, Clone)]
struct Stores {
    workspace: ScopeId,
    global: Option<ScopeId>,
    snapshots: [Option<String>; 2],
}

/// Output paths as scope paths of the two stores they may name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputPaths {
    pub workspace: Vec<String>,
    /// Paths below the user's global store (module docs: only with a read-write global store).
    pub global: Vec<String>,
}

impl OutputPaths {
    pub fn is_empty(&self) -> bool {
        self.workspace.is_empty() && self.global.is_empty()
    }
}

/// The scope paths of output paths `raw`; those in the global store kept only with `global`.
pub fn output_paths(raw: &[String], global: bool) -> Result<OutputPaths, ComputeError> {
    let mut out = OutputPaths::default();
    for p in raw {
        match global_path(p) {
            Some(g) if global => out.global.push(g),
            Some(_) => {}
            None => out.workspace.push(output_path(p)?),
        }
    }
    Ok(out)
}

/// The artifact path of scope path `path` of the global store.
pub fn global_artifact(path: &str) -> String {
    if path.is_empty() {
        GLOBAL_ROOT.to_string()
    } else {
        format!("{GLOBAL_ROOT}/{path}")
    }
}

/// The container's view of scope path `rel` (`""`: the root): `/workspace` or `/workspace/<rel>`.
pub fn workspace_path(rel: &str) -> String {
    if rel.is_empty() {
        WORKSPACE.to_string()
    } else {
        format!("{WORKSPACE}/{rel}")
    }
}

/// The content type of a file name, from its extension (`application/octet-stream` otherwise).
pub fn content_type(path: &str) -> &'static str {
    let ext = path.rsplit('/').next().and_then(|n| n.rsplit_once('.')).map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("txt" | "log") => "text/plain",
        Some("md") => "text/markdown",
        Some("csv") => "text/csv",
        Some("tsv") => "text/tab-separated-values",
        Some("html" | "htm") => "text/html",
        Some("css") => "text/css",
        Some("js") => "text/javascript",
        Some("json") => "application/json",
        Some("xml") => "application/xml",
        Some("yaml" | "yml") => "application/yaml",
        Some("py") => "text/x-python",
        Some("pdf") => "application/pdf",
        Some("zip") => "application/zip",
        Some("gz" | "tgz") => "application/gzip",
        Some("tar") => "application/x-tar",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("svg") => "image/svg+xml",
        Some("webp") => "image/webp",
        Some("parquet") => "application/vnd.apache.parquet",
        Some("ipynb") => "application/x-ipynb+json",
        _ => "application/octet-stream",
    }
}

/// One store an environment's outputs are listed from: its engine, the scope paths to walk, and
/// whether its artifact paths carry the `/__global__` root.
struct Source<'a> {
    engine: &'a ScopeEngine,
    paths: &'a [String],
    global: bool,
}

/// Listed outputs: artifact path → (index of its source, scope path, listed size).
type Listed = BTreeMap<String, (usize, String, u64)>;

/// The regular files under each source's paths (deduplicated, by artifact path) changed at or after
/// `since` (`None`: all) with their listed sizes; refuses past the file and byte bounds (over all
/// sources together) before anything is read. A path that does not exist has no files.
fn output_files(
    sources: &[Source<'_>],
    since: Option<SystemTime>,
    (max_files, max_bytes): (u64, u64),
) -> Result<Listed, ComputeError> {
    let changed = |attr: &scopefs::engine::Attr| attr.kind == FileKind::File && since.is_none_or(|s| attr.ctime >= s);
    let mut files = Listed::new();
    // Checked at each file: the map never holds more than one file past the bound (the listing
    // itself is bounded by its bytes, `limits.max_listing_bytes`).
    let mut add = |source: usize, path: String, size: u64| {
        let key = if sources[source].global { global_artifact(&path) } else { path.clone() };
        files.insert(key, (source, path, size));
        if files.len() as u64 > max_files {
            refuse(Bound::ArtifactFiles);
            return Err(ComputeError::OutputsTooLarge(format!(
                "more than {max_files} output files (limits.max_artifact_files)"
            )));
        }
        Ok(())
    };
    for (i, source) in sources.iter().enumerate() {
        for p in source.paths {
            let attr = match source.engine.resolve_path(p) {
                Ok(a) => a,
                Err(scopefs::engine::EngineError::NotFound) => continue,
                Err(e) => return Err(ServiceError::from(e).into()),
            };
            match attr.kind {
                FileKind::File if changed(&attr) => add(i, p.clone(), attr.size)?,
                FileKind::Dir => {
                    let listing = source.engine.list_path(p, true).map_err(ServiceError::from)?;
                    for e in listing.iter().filter(|e| changed(&e.attr)) {
                        add(i, e.path.clone(), e.attr.size)?;
                    }
                }
                _ => {}
            }
        }
    }
    let total = files.values().fold(0u64, |a, (_, _, s)| a.saturating_add(*s));
    if total > max_bytes {
        refuse(Bound::ArtifactBytes);
        return Err(ComputeError::OutputsTooLarge(format!(
            "output files hold more than {max_bytes} bytes (limits.max_artifact_bytes)"
        )));
    }
    Ok(files)
}

/// SHA-256 and length of the first `size` bytes of a file (a file that shrank is hashed as it is).
fn hash_file(engine: &ScopeEngine, path: &str, size: u64) -> Result<(String, u64), ComputeError> {
    let mut hasher = Sha256::new();
    let mut read = 0u64;
    while read < size {
        let chunk = engine.read_path(path, read, CHUNK.min(size - read)).map_err(ServiceError::from)?;
        if chunk.is_empty() {
            break;
        }
        read += chunk.len() as u64;
        hasher.update(&chunk);
    }
    Ok((hex(&hasher.finalize()), read))
}

/// Since when an environment's changed files are its outputs (`EnvironmentOptions::outputs_since_ns`).
fn outputs_since(opts: &EnvironmentOptions) -> Option<SystemTime> {
    let ns = u64::try_from(opts.outputs_since_ns?).ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl ComputeService {
    /// The stores `paths` name: the scope, and the user's global store when the environment had
    /// it read-write and some output path is in it.
    fn live_stores(
        &self,
        scope: &ScopeId,
        paths: &OutputPaths,
        opts: &EnvironmentOptions,
    ) -> Result<Stores, ComputeError> {
        let global = opts.global_store_scope.as_deref().filter(|_| !paths.global.is_empty());
        let global = global.map(|id| ScopeId::parse(id).map_err(|_| ServiceError::ScopeNotFound)).transpose()?;
        Ok(Stores { workspace: scope.clone(), global, snapshots: [None, None] })
    }

    /// The engines of `stores`: the workspace's, then the global store's (if any).
    fn output_engines(&self, stores: &Stores) -> Result<Vec<(std::sync::Arc<ScopeEngine>, bool)>, ComputeError> {
        let engine = |id: &ScopeId| -> Result<std::sync::Arc<ScopeEngine>, ComputeError> {
            let rec = self.registry.get(id)?.ok_or(ServiceError::ScopeNotFound)?;
            Ok(self.open.engine(&rec)?)
        };
        let mut out = vec![(engine(&stores.workspace)?, false)];
        if let Some(id) = &stores.global {
            out.push((engine(id)?, true));
        }
        Ok(out)
    }

    /// Snapshots of the stores that hold listed outputs (`keep`: workspace, global), taken as the
    /// environment ends (O(metadata)); taken again, the ones taken before. Without a snapshot taker,
    /// the live stores.
    fn kept_stores(&self, live: &Stores, keep: [bool; 2], env_id: &str) -> Result<Stores, ComputeError> {
        let Some(take) = self.output_snapshots.get() else { return Ok(live.clone()) };
        let mut kept = live.clone();
        if keep[0] {
            let id = format!("out.{env_id}");
            if self.may_keep(&live.workspace, &id)? {
                kept.workspace = take(&live.workspace, &id)?;
                kept.snapshots[0] = Some(id);
            }
        }
        if let (Some(global), true) = (&live.global, keep[1]) {
            let id = format!("out.{env_id}.g");
            if self.may_keep(global, &id)? {
                kept.global = Some(take(global, &id)?);
                kept.snapshots[1] = Some(id);
            }
        }
        Ok(kept)
    }

    /// Whether output snapshot `id` of `scope` may be used: one taken before always; a new one
    /// while the scope keeps fewer than `limits.max_output_snapshots_per_scope` (past it, the
    /// outputs are hashed in the live scope and name no snapshot: said in the log).
    fn may_keep(&self, scope: &ScopeId, id: &str) -> Result<bool, ComputeError> {
        let cap = self.compute.as_ref().map_or(u64::MAX, |c| c.settings.max_output_snapshots_per_scope);
        let snapshots = self.registry.snapshots(scope)?;
        if snapshots.iter().any(|s| s.snapshot_id == id) {
            return Ok(true);
        }
        let kept = snapshots.iter().filter(|s| s.snapshot_id.starts_with("out.")).count() as u64;
        if kept >= cap {
            tracing::warn!(scope_id = %scope, kept, "the scope keeps its most output snapshots; these outputs name none");
            return Ok(false);
        }
        Ok(true)
    }

    /// Lists the outputs under `paths` within the bounds, then hands each listed file to `each`.
    fn with_outputs<T>(
        &self,
        stores: &Stores,
        paths: &OutputPaths,
        opts: &EnvironmentOptions,
        each: impl FnOnce(&[Source<'_>], Listed) -> Result<T, ComputeError>,
    ) -> Result<T, ComputeError> {
        let engines = self.output_engines(stores)?;
        let sources: Vec<Source<'_>> = engines
            .iter()
            .map(|(engine, global)| Source {
                engine,
                paths: if *global { &paths.global } else { &paths.workspace },
                global: *global,
            })
            .collect();
        let listed = output_files(&sources, outputs_since(opts), self.artifact_bounds(opts))?;
        each(&sources, listed)
    }

    /// Checks the bounds of the outputs under `paths` without reading any file.
    pub(super) fn check_outputs(
        &self,
        scope: &ScopeId,
        paths: &OutputPaths,
        opts: &EnvironmentOptions,
    ) -> Result<usize, ComputeError> {
        let live = self.live_stores(scope, paths, opts)?;
        self.with_outputs(&live, paths, opts, |_, listed| Ok(listed.len()))
    }

    /// The artifact manifest of the regular files under `paths` of environment `env_id`, by
    /// artifact path: listed (within the bounds) in the live stores, then listed again and hashed
    /// in snapshots of them taken now, which each artifact names (its bytes stay as hashed).
    pub(super) fn collect_outputs(
        &self,
        scope: &ScopeId,
        paths: &OutputPaths,
        opts: &EnvironmentOptions,
        env_id: &str,
    ) -> Result<Vec<ArtifactEntry>, ComputeError> {
        let live = self.live_stores(scope, paths, opts)?;
        let keep = self.with_outputs(&live, paths, opts, |sources, listed| {
            let global = |s: usize| sources[s].global;
            Ok([listed.values().any(|(s, ..)| !global(*s)), listed.values().any(|(s, ..)| global(*s))])
        })?;
        if keep == [false, false] {
            return Ok(Vec::new());
        }
        let kept = self.kept_stores(&live, keep, env_id)?;
        self.with_outputs(&kept, paths, opts, |sources, listed| {
            let mut out = Vec::new();
            for (path, (source, scope_path, size)) in listed {
                let (sha256, size_bytes) = match hash_file(sources[source].engine, &scope_path, size) {
                    Ok(h) => h,
                    // Removed between the listing and the read: not an output any more.
                    Err(ComputeError::Service(ServiceError::Engine(scopefs::engine::EngineError::NotFound))) => {
                        continue
                    }
                    Err(e) => return Err(e),
                };
                let content_type = content_type(&path).to_string();
                let snapshot_id = kept.snapshots[usize::from(sources[source].global)].clone();
                out.push(ArtifactEntry { path, size_bytes, sha256, content_type, snapshot_id });
            }
            Ok(out)
        })
    }

    /// The configured artifact bounds, lowered by the environment's own `limits`.
    fn artifact_bounds(&self, opts: &EnvironmentOptions) -> (u64, u64) {
        let (files, bytes) = match self.compute.as_ref() {
            Some(c) => (c.settings.max_artifact_files, c.settings.max_artifact_bytes),
            None => (0, 0),
        };
        (files.min(opts.max_artifact_files.unwrap_or(u64::MAX)), bytes.min(opts.max_artifact_bytes.unwrap_or(u64::MAX)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_paths_stay_in_the_workspace() {
        assert_eq!(output_path("/workspace").unwrap(), "");
        assert_eq!(output_path("/workspace/").unwrap(), "");
        assert_eq!(output_path("/workspace/out/a.csv").unwrap(), "out/a.csv");
        assert_eq!(output_path("out").unwrap(), "out");
        for bad in ["/etc", "/workspace/../etc", "out/../../x", "/threads/t/x"] {
            assert!(matches!(output_path(bad), Err(ComputeError::Invalid("output_paths", _))), "{bad}");
        }
        // Seed 003 §7.3's default: the global store is taken; its paths count only when the
        // environment had it read-write.
        let seed_default = ["/workspace".to_string(), "/__global__".to_string(), "/__global__/lib/".to_string()];
        let both = OutputPaths { workspace: vec![String::new()], global: vec![String::new(), "lib".into()] };
        assert_eq!(output_paths(&seed_default, true).unwrap(), both);
        let workspace_only = OutputPaths { workspace: vec![String::new()], global: Vec::new() };
        assert_eq!(output_paths(&seed_default, false).unwrap(), workspace_only);
        assert!(output_paths(&["/__global__".to_string()], false).unwrap().is_empty());
        for bad in ["/__global__/../etc", "/__globalx", "/__global__/a/../../b"] {
            assert_eq!(global_path(bad), None, "{bad}");
            assert!(output_paths(&[bad.to_string()], true).is_err(), "{bad}");
        }
        assert_eq!(
            (global_artifact(""), global_artifact("lib/a.py")),
            ("/__global__".into(), "/__global__/lib/a.py".into())
        );
    }

    #[test]
    fn content_types_come_from_the_extension() {
        assert_eq!(content_type("out/result.CSV"), "text/csv");
        assert_eq!(content_type("a.tar.gz"), "application/gzip");
        assert_eq!(content_type("dir.d/noext"), "application/octet-stream");
        assert_eq!(content_type("plot.png"), "image/png");
    }
}
