//! Disk faults (issue 21, item 5 c): a fixed workload recorded once, then run again with one
//! write or one sync failing (`ENOSPC`, `EIO`) at every index the baseline had; after each run the
//! outcomes are explained by the model (a call that failed may or may not have taken effect), a
//! restart shows every call that returned Ok, the power-loss states of the run keep what its last
//! successful durability point covered, and nothing panics or hangs.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Duration;

use scopefs::engine::StorageSettings;

use super::check::compare;
use super::harness::{open_and_observe, runtime, Observed, Rig, StepRun};
use super::image::HashCache;
use super::model::{Model, Step};
use super::ops::FaultOn;
use super::states::power_loss_family;

/// Longest a faulted run may take before it counts as a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(90);
/// Most model states kept per prefix while failed calls branch.
const MAX_CANDIDATES: usize = 64;

fn s(p: &str) -> String {
    p.to_string()
}

/// The workload: every kind of step, small and inline blocks, uploads, durability points.
pub fn workload() -> Vec<Step> {
    vec![
        Step::Mkdir(s("d")),
        Step::Create(s("d/a")),
        Step::Write(s("d/a"), 0, 6000, 1),
        Step::SetXattr(s("d/a"), 2),
        Step::Create(s("d/s")),
        Step::Write(s("d/s"), 0, 600, 3),
        Step::Fsync(s("d/a")),
        Step::Link(s("d/a"), s("d/l")),
        Step::Rename(s("d/s"), s("d/t")),
        Step::Write(s("d/a"), 100, 200, 4),
        Step::FsyncDir,
        Step::Unlink(s("d/l")),
        Step::WaitUploads,
        Step::Truncate(s("d/a"), 3000),
        Step::Commit,
        Step::Create(s("e")),
        Step::Write(s("e"), 0, 700, 5),
        Step::Sync,
    ]
}

/// The model states each prefix of a run may have left: a step that returned Ok applied, one
/// that failed with an I/O error applied or not, one refused as the model refuses it not applied.
/// `Err`: no model state explains an outcome.
pub fn candidates(steps: &[Step], runs: &[StepRun]) -> Result<Vec<Vec<Model>>, String> {
    let mut cur = vec![Model::default()];
    let mut out = vec![cur.clone()];
    for (i, (step, run)) in steps.iter().zip(runs).enumerate() {
        let mut next: Vec<Model> = Vec::new();
        for m in &cur {
            let mut applied = m.clone();
            let r = applied.apply(step, i);
            match (&run.outcome, r) {
                (Ok(()), Ok(())) => next.push(applied),
                (Err(e), r) if e.starts_with("io:") => {
                    next.push(m.clone());
                    if r.is_ok() {
                        next.push(applied);
                    }
                }
                (Err(e), Err(r)) if *e == r => next.push(m.clone()),
                _ => {}
            }
        }
        let mut unique: Vec<Model> = Vec::new();
        for m in next {
            if !unique.iter().any(|u| u.shown() == m.shown() && u.link_sets() == m.link_sets()) {
                unique.push(m);
            }
        }
        unique.truncate(MAX_CANDIDATES);
        if unique.is_empty() {
            return Err(format!("no model state explains step {i} {step:?} returning {:?}", run.outcome));
        }
        out.push(unique.clone());
        cur = unique;
    }
    Ok(out)
}

/// Whether `o` shows a candidate after some prefix `k >= durable`; files written at or after
/// step `durable` may read EIO (`lenient`), or none may (a restart).
fn explained(o: &Observed, sets: &[Vec<Model>], durable: usize, lenient: bool) -> Result<(), String> {
    let mut diffs = Vec::new();
    for k in (durable..sets.len()).rev() {
        let mut first = None;
        for m in &sets[k] {
            let may_fail = |p: &str| lenient && m.last_write(p).is_some_and(|w| w >= durable);
            match compare(o, m, &may_fail, false) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        diffs.push(format!("after {k} steps ({} model states): {}", sets[k].len(), first.unwrap_or_default()));
    }
    Err(format!("matches no prefix {durable}..={}; {}", sets.len() - 1, diffs.join("; ")))
}

/// Where this process's threads wait in the kernel (name, wait channel, innermost frames).
fn thread_states() -> String {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
        let frames: Vec<String> = read("stack")
            .lines()
            .take(6)
            .map(|l| l.split_whitespace().last().unwrap_or("").split('+').next().unwrap_or("").to_string())
            .collect();
        out.push(format!("{} [{}] {}", read("comm").trim(), read("wchan"), frames.join("<")));
    }
    out.join("; ")
}

/// One faulted run and what it showed.
pub struct FaultRun {
    pub on: FaultOn,
    pub errno: i32,
    /// What the fault hit (`None`: the run had fewer requests of that kind).
    pub fired: Option<String>,
    /// The variant of each failed call (`io:*` outcomes), in order.
    pub errors: Vec<(usize, String)>,
    pub states: usize,
    pub checks_held: usize,
    pub failures: Vec<String>,
}

fn errno_name(errno: i32) -> &'static str {
    if errno == libc::ENOSPC {
        "ENOSPC"
    } else {
        "EIO"
    }
}

/// Runs `steps` with the fault armed, on a worker thread with a deadline; then checks.
pub fn faulted_run(settings: &StorageSettings, steps: &[Step], on: FaultOn, errno: i32, depth: u32) -> FaultRun {
    let mut rig = Rig::new(settings);
    rig.recorder().arm(on, errno);
    let abort = rig.recorder().abort_handle();
    let describe = rig.recorder().describe_handle();
    let scope = rig.scope.clone();
    let (tx, rx) = mpsc::channel();
    let work: Vec<Step> = steps.to_vec();
    let worker = std::thread::spawn(move || {
        let runs: Vec<StepRun> = work
            .iter()
            .map(|st| {
                let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rig.step(st)));
                attempt.unwrap_or_else(|_| StepRun { step: st.clone(), begin: 0, end: 0, outcome: Err(s("panic")) })
            })
            .collect();
        let fired = rig.recorder().fired();
        let (recording, dir, drained) = rig.finish_draining();
        let _ = tx.send((runs, fired, recording, dir, drained));
    });
    let label = format!("{} at {:?}", errno_name(errno), on);
    let (runs, fired, recording, dir, drained) = match rx.recv_timeout(RUN_DEADLINE) {
        Ok(done) => done,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            let (recorder, threads) = (describe(), thread_states());
            abort();
            let _ = rx.recv_timeout(Duration::from_secs(30));
            panic!(
                "{label}: the workload did not finish within {RUN_DEADLINE:?} (a hang); {recorder}; threads: {threads}"
            );
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let why = worker.join().err().map(|p| format!("{p:?}")).unwrap_or_default();
            panic!("{label}: the workload's thread ended without a result (it panicked: {why})");
        }
    };
    let _ = worker.join();
    let fired = fired.first().map(|f| f.what.clone());
    let errors = runs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            r.outcome.as_ref().err().filter(|e| e.starts_with("io:") || *e == "panic").map(|e| (i, e.clone()))
        })
        .collect();
    let mut run = FaultRun { on, errno, fired, errors, states: 0, checks_held: 0, failures: Vec::new() };
    let mut failures = Vec::new();
    for r in runs.iter().filter(|r| r.outcome.as_ref().is_err_and(|e| e == "panic")) {
        failures.push(format!("step {:?} panicked", r.step));
    }
    if !drained {
        failures.push(s("uploads did not drain after the fault (a hang)"));
    }
    match candidates(steps, &runs) {
        Err(e) => failures.push(e),
        Ok(sets) => {
            let rt = runtime();
            // A restart on the directory as the run left it: every call that returned Ok shows.
            run.states += 1;
            let restarted = open_and_observe(&dir.path().join("backing"), &scope, settings, rt.handle());
            match restarted.and_then(|o| explained(&o, &sets, steps.len(), false)) {
                Ok(()) => run.checks_held += 1,
                Err(e) => failures.push(format!("after a restart: {e}")),
            }
            // A power loss at the end: what the last successful durability point covered stays.
            let durable = runs.iter().rposition(|r| r.step.is_durability_point() && r.outcome.is_ok()).unwrap_or(0);
            let mut cache = HashCache::default();
            let mut seen = std::collections::HashSet::new();
            // Depth 1: the state with none of the unsynced ops (exactly what the syncs covered) and
            // the one without the metadata WAL's unsynced writes; depth 2+: the whole family.
            let family = power_loss_family(&recording, recording.log.len(), depth).into_iter().filter(|f| {
                depth >= 2 || f.label == "none of the unsynced ops" || f.label == "all but the data of meta.sqlite3-wal"
            });
            for (n, sel) in family.enumerate() {
                let image = sel.build(&recording);
                if !seen.insert(image.hash(&mut cache)) {
                    continue;
                }
                run.states += 1;
                let at = dir.path().join(format!("power-{n}"));
                let obs = image
                    .materialize(&at)
                    .map_err(|e| e.to_string())
                    .and_then(|()| super::harness::open_rebooted(&at, &scope, settings, rt.handle()));
                match obs.and_then(|o| explained(&o, &sets, durable, true)) {
                    Ok(()) => run.checks_held += 1,
                    Err(e) => failures
                        .push(format!("power loss at the end, state \"{}\" ({durable} steps durable): {e}", sel.label)),
                }
                let _ = std::fs::remove_dir_all(&at);
            }
        }
    }
    let what = run.fired.clone().unwrap_or_else(|| s("did not fire"));
    run.failures = failures.into_iter().map(|f| format!("{label} ({what}): {f}")).collect();
    run
}

/// Counts of a fault campaign.
#[derive(Default)]
pub struct Campaign {
    pub runs: Vec<FaultRun>,
    pub baseline: (usize, usize),
}

impl Campaign {
    /// Error variants the engine returned, by injected errno: (errno name, variant) -> count.
    pub fn error_kinds(&self) -> BTreeMap<(&'static str, String), usize> {
        let mut out = BTreeMap::new();
        for r in &self.runs {
            for (_, e) in &r.errors {
                *out.entry((errno_name(r.errno), e.trim_start_matches("io:").to_string())).or_insert(0) += 1;
            }
        }
        out
    }

    pub fn print(&self, elapsed: Duration) {
        let fired = self.runs.iter().filter(|r| r.fired.is_some()).count();
        let states: usize = self.runs.iter().map(|r| r.states).sum();
        let held: usize = self.runs.iter().map(|r| r.checks_held).sum();
        let failed = self.runs.iter().filter(|r| !r.failures.is_empty()).count();
        eprintln!(
            "disk faults: baseline {} writes and {} syncs; {} fault points ({} fired), {} states checked, {} checks held, {} runs with failures; {:.1?}",
            self.baseline.0,
            self.baseline.1,
            self.runs.len(),
            fired,
            states,
            held,
            failed,
            elapsed
        );
        for ((errno, variant), n) in self.error_kinds() {
            eprintln!("disk faults: injected {errno}: the engine answered {variant} {n} times");
        }
    }
}
