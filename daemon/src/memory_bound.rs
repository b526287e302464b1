//! The daemon's memory bound, derived from its configuration: each budget a tenant's requests
//! are charged to, and each cost per thread or per connection that the configuration bounds by
//! count. `scopefs serve --print-config` shows it term by term; the worker compares it with its
//! cgroup's `memory.max` at startup and exports it on `/metrics`.
//!
//! The bound is what the configuration lets tenants make the daemon hold at once, with every
//! budget full, every worker busy and every connection streaming; the daemon's own code, runtime
//! and registry are [`BASELINE`], and each mounted scope adds [`PER_MOUNTED_SCOPE`] (a count the
//! configuration does not bound, so it is stated apart).

use std::fmt::Write as _;

use scopefs::config::Config;

/// The daemon with no scope open and no request in flight: code, the tokio runtime, the
/// registry's connection and the allocator's arenas (measured at about 40 MiB; kept with room).
pub const BASELINE: u64 = 96 << 20;
/// One mounted scope with nothing open: its mount session, inode table and engine state (an idle
/// mounted scope was measured at 60–100 KiB).
pub const PER_MOUNTED_SCOPE: u64 = 128 << 10;
/// The thread stack each blocking HTTP worker may touch (tokio's default for its blocking pool).
pub const WORKER_STACK: u64 = 2 << 20;
/// One open scope database besides its page cache (the connection, its schema and statements).
pub const PER_OPEN_DATABASE: u64 = 256 << 10;
/// Route classes with a pool of `limits.workers_per_route_class` blocking workers each.
const ROUTE_CLASSES: u64 = 4;

/// One term of the bound: its bytes and how they follow from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub name: &'static str,
    pub bytes: u64,
    pub from: String,
}

/// The bound, term by term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryBound {
    pub terms: Vec<Term>,
}

/// Bytes one HTTP connection may hold outside every budget: hyper's read and write buffers
/// (`http::CONNECTION_BUFFER_BYTES` each) and a streamed download's or upload's buffers.
pub fn per_connection_bytes() -> u64 {
    2 * crate::http::CONNECTION_BUFFER_BYTES as u64 + crate::api::stream_buffer_bytes()
}

/// Bytes of a FUSE worker: its stack, its request buffer (a write of `max_write_kib` or an
/// extended attribute) and a read's answer (the kernel asks at most 1 MiB at a time).
fn fuse_worker_bytes(cfg: &Config) -> u64 {
    let request = scopefs_fs::mount::resident_request_bytes(cfg.fuse.max_write_kib.saturating_mul(1024));
    (scopefs_fs::mount::WORKER_STACK + request) as u64 + (1 << 20)
}

/// Bytes answers hold beyond their charges: one larger than its user's share
/// (`limits.tools_body_memory_per_user_bytes`) is charged the share, and as many such answers as
/// shares fit in the budget may be held at once. The largest answer is a `read_file` of a file of
/// the `/tools` limit (its content, then as JSON up to six bytes a byte) with its fields.
fn capped_answers_beyond_charge(cfg: &Config) -> u64 {
    let l = &cfg.limits;
    let share = l.tools_body_memory_per_user_bytes.clamp(1, l.tools_body_memory_bytes.max(1));
    let largest_answer = 7 * crate::api::tools_file_limit(cfg) + 1024;
    l.tools_body_memory_bytes.div_ceil(share) * largest_answer.saturating_sub(share)
}

impl MemoryBound {
    /// The bound of `cfg` (without mounted scopes).
    pub fn of(cfg: &Config) -> MemoryBound {
        let l = &cfg.limits;
        let fuse_threads = cfg.fuse.threads as u64;
        let workers = l.workers_per_route_class as u64;
        let file_limit = crate::api::tools_file_limit(cfg);
        let exec_output = crate::api::exec_output_bytes(cfg);
        let connections = l.http_max_connections as u64;
        let per_connection = per_connection_bytes();
        let mib = |b: u64| b >> 20;
        let terms = vec![
            Term { name: "baseline", bytes: BASELINE, from: "code, runtime, registry".into() },
            Term {
                name: "fuse_workers",
                bytes: fuse_threads * fuse_worker_bytes(cfg),
                from: format!("fuse.threads {fuse_threads} x (stack, a request of fuse.max_write_kib, a read)"),
            },
            Term {
                name: "fsync_threads",
                bytes: fuse_threads * scopefs_fs::mount::WORKER_STACK as u64,
                from: format!("fuse.threads {fuse_threads} x a stack (fsyncs waiting off the workers)"),
            },
            Term { name: "dirty_memory", bytes: cfg.dirty_memory_max_bytes, from: "dirty_memory_max_bytes".into() },
            Term { name: "block_fetches", bytes: cfg.fetch_memory_max_bytes, from: "fetch_memory_max_bytes".into() },
            Term {
                name: "uploads",
                bytes: 2 * cfg.upload_parallelism as u64 * cfg.block_size,
                from: format!("upload_parallelism {} x 2 x block_size", cfg.upload_parallelism),
            },
            Term {
                name: "metadata",
                bytes: cfg.metadata_cache_max_bytes + l.max_open_scope_databases as u64 * PER_OPEN_DATABASE,
                from: format!(
                    "metadata_cache_max_bytes + limits.max_open_scope_databases {} x {} KiB",
                    l.max_open_scope_databases,
                    PER_OPEN_DATABASE >> 10
                ),
            },
            Term {
                name: "metadata_shipping",
                bytes: 2 * l.metadata_queue_max_bytes + cfg.metadata_cache_max_bytes,
                from: "limits.metadata_queue_max_bytes x 2 (queued, being put) + a snapshot (one at a time; \
                       about metadata_cache_max_bytes)"
                    .into(),
            },
            Term {
                name: "listings",
                bytes: 2 * l.listing_memory_max_bytes,
                from: "limits.listing_memory_max_bytes x 2 (a listing and its answer)".into(),
            },
            Term {
                name: "tools_bodies_and_answers",
                bytes: l.tools_body_memory_bytes + capped_answers_beyond_charge(cfg),
                from: "limits.tools_body_memory_bytes (and what answers larger than a user's share hold beyond it)"
                    .into(),
            },
            Term {
                name: "http_workers",
                bytes: ROUTE_CLASSES * workers * WORKER_STACK + workers * (3 * file_limit + exec_output),
                from: format!(
                    "limits.workers_per_route_class {workers} x (4 stacks, 3 files of the /tools limit \
                     ({} MiB), a command's output ({} MiB): executor.max_output_bytes)",
                    mib(file_limit),
                    mib(exec_output)
                ),
            },
            Term {
                name: "http_connections",
                bytes: connections * per_connection,
                from: format!(
                    "limits.http_max_connections {connections} x {} KiB (buffers, a stream's chunks)",
                    per_connection >> 10
                ),
            },
        ];
        MemoryBound { terms }
    }

    /// Bytes of the bound without mounted scopes.
    pub fn total(&self) -> u64 {
        self.terms.iter().map(|t| t.bytes).sum()
    }

    /// Bytes of the bound with `mounted` scopes mounted.
    pub fn with_mounts(&self, mounted: u64) -> u64 {
        self.total().saturating_add(mounted.saturating_mul(PER_MOUNTED_SCOPE))
    }

    /// The bound as TOML comment lines (appended to `--print-config`): the total in MiB, the
    /// per-scope rate and each term.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\n# Memory bound: {} MiB, plus {} KiB per mounted scope (systemd: MemoryMax=).",
            self.total().div_ceil(1 << 20),
            PER_MOUNTED_SCOPE >> 10
        );
        for t in &self.terms {
            let _ = writeln!(out, "#   {:<26} {:>7} MiB  {}", t.name, t.bytes.div_ceil(1 << 20), t.from);
        }
        out
    }
}

/// The memory limit of the cgroup this process runs in, `None` when there is none or it cannot be
/// read: `memory.max` under cgroup v2, `memory.limit_in_bytes` of the v1 memory controller.
pub fn cgroup_memory_max() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    memory_max_under(&cgroups, std::path::Path::new("/sys/fs/cgroup"))
}

/// [`cgroup_memory_max`] for the membership lines `cgroups` (`/proc/self/cgroup`) under `root`.
fn memory_max_under(cgroups: &str, root: &std::path::Path) -> Option<u64> {
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        let file = if controllers.split(',').any(|c| c == "memory") {
            root.join("memory").join(rel).join("memory.limit_in_bytes")
        } else if controllers.is_empty() {
            root.join(rel).join("memory.max")
        } else {
            continue;
        };
        if let Ok(text) = std::fs::read_to_string(file) {
            // "max" (v2) and the page-rounded i64::MAX (v1) both mean no limit.
            return text.trim().parse::<u64>().ok().filter(|&v| v < 1 << 62);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_budget_and_count_moves_the_bound() {
        let base = Config::default();
        let total = MemoryBound::of(&base).total();
        type Grow = fn(&mut Config);
        let bigger: [(&str, Grow); 11] = [
            ("dirty_memory_max_bytes", |c| c.dirty_memory_max_bytes *= 2),
            ("metadata_queue_max_bytes", |c| c.limits.metadata_queue_max_bytes *= 2),
            ("metadata_cache_max_bytes", |c| c.metadata_cache_max_bytes *= 2),
            ("listing_memory_max_bytes", |c| c.limits.listing_memory_max_bytes *= 2),
            ("tools_body_memory_bytes", |c| c.limits.tools_body_memory_bytes *= 2),
            ("http_max_connections", |c| c.limits.http_max_connections *= 2),
            ("workers_per_route_class", |c| c.limits.workers_per_route_class *= 2),
            ("fuse.threads", |c| c.fuse.threads *= 2),
            ("block_size", |c| c.block_size *= 2),
            ("fetch_memory_max_bytes", |c| c.fetch_memory_max_bytes *= 2),
            ("upload_parallelism", |c| c.upload_parallelism *= 2),
        ];
        for (key, grow) in bigger {
            let mut cfg = base.clone();
            grow(&mut cfg);
            assert!(MemoryBound::of(&cfg).total() > total, "{key} does not move the bound");
        }
    }

    #[test]
    fn the_units_memory_max_holds_the_default_bound_with_every_kept_mount() {
        let unit = include_str!("../../systemd/scopefs.service");
        let value = |key: &str| {
            let line = unit.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("{key} in the unit"));
            line.trim().to_string()
        };
        let max = value("MemoryMax=");
        let max: u64 = max.strip_suffix('G').expect("MemoryMax in G").parse::<u64>().unwrap() << 30;
        let mounts: u64 = value("FileDescriptorStoreMax=").parse().unwrap();
        let bound = MemoryBound::of(&Config::default()).with_mounts(mounts);
        assert!(bound <= max, "the default bound {} MiB is over the unit's MemoryMax {} MiB", bound >> 20, max >> 20);
        assert!(max - bound < 1 << 30, "MemoryMax is more than 1 GiB above the default bound: lower it");
    }

    #[test]
    fn the_cgroup_limit_is_read_from_either_hierarchy() {
        let root = tempfile::tempdir().unwrap();
        let at = |rel: &str, file: &str, text: &str| {
            let dir = root.path().join(rel);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(file), text).unwrap();
        };
        at("system.slice/scopefs.service", "memory.max", "8589934592\n");
        let v2 = "0::/system.slice/scopefs.service\n";
        assert_eq!(memory_max_under(v2, root.path()), Some(8 << 30));
        at("memory/job", "memory.limit_in_bytes", "1073741824\n");
        let hybrid = "4:memory:/job\n1:cpu:/\n0::/\n";
        assert_eq!(memory_max_under(hybrid, root.path()), Some(1 << 30));
        at("unlimited", "memory.max", "max\n");
        assert_eq!(memory_max_under("0::/unlimited\n", root.path()), None);
        at("memory/free", "memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(memory_max_under("4:memory:/free\n", root.path()), None);
        assert_eq!(memory_max_under("0::/missing\n", root.path()), None);
    }

    #[test]
    fn the_rendering_is_comments_naming_each_term_and_the_total() {
        let bound = MemoryBound::of(&Config::default());
        let text = bound.render();
        assert!(text.lines().all(|l| l.is_empty() || l.starts_with('#')), "{text}");
        assert!(text.contains(&format!("Memory bound: {} MiB", bound.total().div_ceil(1 << 20))), "{text}");
        for t in &bound.terms {
            assert!(text.contains(t.name), "{text}");
        }
        assert_eq!(bound.with_mounts(10), bound.total() + 10 * PER_MOUNTED_SCOPE);
    }
}
