//! `scopefs bench`: timed file-system workloads (W1–W8) against any mounted directory.
//!
//! The workloads run inside a fresh subdirectory of DIR, so the same command
//! measures a native directory, a scopefs mount, s3fs or an rclone mount:
//!
//! | id | workload |
//! |----|----------|
//! | W1 | write one file sequentially in 1 MiB writes, `fsync` at the end (timed) |
//! | W2 | read it back cold (kernel caches dropped where permitted), then warm |
//! | W3 | create N × 4 KiB files spread over 100 directories |
//! | W4 | `stat` every file and list every directory |
//! | W5 | unpack a real source tree (thousands of files), then `git init/add/commit` |
//! | W6 | `rm -rf` of everything created |
//! | W7 | `--streams` parallel sequential writers, each its own file of `size_mib / streams` MiB, each `fsync`ed (timed until the last one returns) |
//! | W8 | 200 × (create a file, write 4 KiB, `fsync`), each timed: median and 99th percentile |
//!
//! `scopefs bench compare RESULTS_DIR` turns the `--json` results of several targets
//! (native, bindfs, scopefs, s3fs, rclone) into one table with ratios ([`compare`]).
//!
//! This is a measuring tool, not a test: it reports, it does not judge.

use std::fs;
use std::path::PathBuf;

use anyhow::{ensure, Context, Result};
use serde::Serialize;

mod compare;
mod cpu;
mod scopes;
mod workloads;

const MIB: u64 = 1 << 20;

/// Arguments of `scopefs bench`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    /// Other modes of `scopefs bench` (default: run the workloads against DIR).
    #[command(subcommand)]
    pub mode: Option<BenchMode>,
    /// An already-mounted directory to measure (native, scopefs, s3fs, rclone ...);
    /// the workloads run in a fresh subdirectory of it.
    #[arg(required_unless_present = "scopes")]
    pub dir: Option<PathBuf>,
    /// Run only these workloads (comma-separated, e.g. `W1,W3`); default: all.
    #[arg(long, value_delimiter = ',', ignore_case = true)]
    pub only: Vec<Workload>,
    /// Size of the W1/W2 file in MiB.
    #[arg(long, default_value_t = 1024)]
    pub size_mib: u64,
    /// Parallel writers of W7 (together they write `--size-mib`).
    #[arg(long, default_value_t = 8)]
    pub streams: u64,
    /// Number of 4 KiB files for W3/W4.
    #[arg(long, default_value_t = 10_000)]
    pub files: u64,
    /// Tarball to unpack in W5 (default: one built once from crates in the
    /// local cargo source cache and kept under the temp directory).
    #[arg(long)]
    pub tree: Option<PathBuf>,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Keep the work directory when W6 is not selected (default: removed, untimed).
    #[arg(long)]
    pub keep: bool,
    /// Name of the measured target, recorded in the JSON report (e.g. `bindfs`).
    #[arg(long)]
    pub label: Option<String>,
    /// Pid of the file-system daemon serving DIR: its peak RSS (`VmHWM` from
    /// `/proc/PID/status`) after the run is recorded in the report.
    #[arg(long)]
    pub daemon_pid: Option<u32>,
    /// Pid of another process (the object store's server, say) whose CPU time each workload is
    /// charged with in the JSON report, beside the daemon's (repeatable).
    #[arg(long = "cpu-pid")]
    pub cpu_pids: Vec<u32>,
    /// Instead of the workloads: start a daemon, provision N idle scopes and report its RSS and
    /// threads per scope, provisioning and restart-to-ready times (`bench/scopes.rs`).
    #[arg(long, value_name = "N")]
    pub scopes: Option<usize>,
}

/// The modes of `scopefs bench` other than running the workloads.
#[derive(clap::Subcommand, Debug)]
pub enum BenchMode {
    /// Print one table with every target's seconds and the ratios between them, from the
    /// `<target>.json` files (`scopefs bench DIR --json --label TARGET`) in a directory.
    Compare(compare::CompareArgs),
}

/// The benchmark workloads.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Workload {
    W1,
    W2,
    W3,
    W4,
    W5,
    W6,
    W7,
    W8,
}

const ALL: [Workload; 8] =
    [Workload::W1, Workload::W2, Workload::W3, Workload::W4, Workload::W5, Workload::W6, Workload::W7, Workload::W8];

/// Whether a row's rate is reported as throughput or as operations per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RateKind {
    Bytes,
    Ops,
}

/// One measured step.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub workload: String,
    pub name: String,
    pub ops: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub rate_kind: RateKind,
}

impl Row {
    fn rate(&self) -> f64 {
        let amount = match self.rate_kind {
            RateKind::Bytes => self.bytes as f64 / MIB as f64,
            RateKind::Ops => self.ops as f64,
        };
        if self.seconds > 0.0 {
            amount / self.seconds
        } else {
            0.0
        }
    }

    fn rate_text(&self) -> String {
        match self.rate_kind {
            RateKind::Bytes => format!("{:.1} MiB/s", self.rate()),
            RateKind::Ops => format!("{:.0} ops/s", self.rate()),
        }
    }
}

/// A row as printed by `--json`: the measurements plus the computed rate.
#[derive(Debug, Serialize)]
struct JsonRow<'a> {
    #[serde(flatten)]
    row: &'a Row,
    rate: f64,
    rate_unit: &'static str,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<&'a str>,
    size_mib: u64,
    files: u64,
    rows: Vec<JsonRow<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    daemon_peak_rss_kib: Option<u64>,
    /// CPU seconds of `cpu_pids` (the daemon's first) during each workload.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    cpu_pids: &'a [u32],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    cpu: &'a [cpu::WorkloadCpu],
    notes: &'a [String],
}

/// `scopefs bench`: dispatches to the selected mode.
pub fn run(args: BenchArgs) -> Result<()> {
    match args.mode {
        Some(BenchMode::Compare(compare_args)) => compare::run(&compare_args),
        None if args.scopes.is_some() => scopes::run(args.scopes.unwrap_or(0), args.json, args.keep),
        None => run_workloads(args),
    }
}

/// Runs the selected workloads against DIR and prints the results.
fn run_workloads(args: BenchArgs) -> Result<()> {
    ensure!(args.size_mib > 0, "--size-mib must be at least 1");
    ensure!(args.files > 0, "--files must be at least 1");
    ensure!((1..=256).contains(&args.streams), "--streams must be between 1 and 256");
    let dir = args.dir.clone().context("DIR is required")?;
    let meta = fs::metadata(&dir).with_context(|| format!("cannot access {}", dir.display()))?;
    ensure!(meta.is_dir(), "{} is not a directory", dir.display());

    let mut selected: Vec<Workload> = if args.only.is_empty() { ALL.to_vec() } else { args.only.clone() };
    selected.sort_unstable();
    selected.dedup();

    let work = dir.join(format!("scopefs-bench-{}-{}", std::process::id(), unix_nanos()));
    fs::create_dir(&work).with_context(|| format!("cannot create the work directory in {}", dir.display()))?;
    let mut bench = workloads::Bench {
        work,
        size_mib: args.size_mib,
        files: args.files,
        streams: args.streams,
        tree: args.tree.clone(),
        rows: Vec::new(),
        notes: Vec::new(),
        big_written: false,
        small_written: false,
        cpu_pids: args.daemon_pid.into_iter().chain(args.cpu_pids.iter().copied()).collect(),
        cpu: Vec::new(),
    };
    let outcome = bench.run_all(&selected);
    if !selected.contains(&Workload::W6) && bench.work.exists() {
        if args.keep {
            bench.notes.push(format!("work directory kept: {}", bench.work.display()));
        } else if let Err(err) = fs::remove_dir_all(&bench.work) {
            bench.notes.push(format!("could not remove the work directory: {err}"));
        }
    }
    outcome?;
    let peak_rss = match args.daemon_pid {
        Some(pid) => Some(peak_rss_kib(pid).with_context(|| format!("cannot read the peak RSS of pid {pid}"))?),
        None => None,
    };

    if args.json {
        let rows = bench
            .rows
            .iter()
            .map(|row| JsonRow {
                row,
                rate: row.rate(),
                rate_unit: match row.rate_kind {
                    RateKind::Bytes => "MiB/s",
                    RateKind::Ops => "ops/s",
                },
            })
            .collect();
        let report = Report {
            target: args.label.as_deref(),
            size_mib: args.size_mib,
            files: args.files,
            rows,
            daemon_peak_rss_kib: peak_rss,
            cpu_pids: &bench.cpu_pids,
            cpu: &bench.cpu,
            notes: &bench.notes,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", format_table(&bench.rows));
        if let Some(kib) = peak_rss {
            println!("daemon peak RSS (VmHWM): {:.1} MiB", kib as f64 / 1024.0);
        }
        for note in &bench.notes {
            println!("note: {note}");
        }
    }
    Ok(())
}

/// A process's peak resident set size in KiB (`VmHWM` of `/proc/PID/status`).
fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_vm_hwm(&status).context("no VmHWM line")
}

fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line["VmHWM:".len()..].split_whitespace().next()?.parse().ok()
}

/// The result table: workload, step, ops, bytes, seconds, rate.
pub fn format_table(rows: &[Row]) -> String {
    let header = ["workload", "step", "ops", "bytes", "seconds", "rate"];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.workload.clone(),
                r.name.clone(),
                r.ops.to_string(),
                r.bytes.to_string(),
                format!("{:.3}", r.seconds),
                r.rate_text(),
            ]
        })
        .collect();
    let mut width = header.map(str::len);
    for row in &cells {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, row: &[String]| {
        let mut parts = Vec::with_capacity(6);
        for (i, cell) in row.iter().enumerate() {
            // Text columns align left, numbers right.
            parts.push(if i < 2 { format!("{cell:<w$}", w = width[i]) } else { format!("{cell:>w$}", w = width[i]) });
        }
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(&mut out, &header.map(String::from));
    line(&mut out, &width.map(|w| "-".repeat(w)));
    for row in &cells {
        line(&mut out, row);
    }
    out
}

fn unix_nanos() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
}

#[cfg(test)]
mod tests;
