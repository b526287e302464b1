//! Running a history through the rig and checking its crash states: one call per test case,
//! totals across cases, and the proptest configuration of each depth.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use proptest::test_runner::{Config, FileFailurePersistence, RngSeed};
use scopefs::engine::StorageSettings;
use scopefs::ids::ScopeId;

use super::check::{check_host_loss, check_kill9, check_power_loss, Opener, Tally};
use super::harness::{runtime, Rig, StepRun};
use super::image::Image;
use super::model::{prefixes, Step};
use super::power_points;
use super::recorder::Recording;

/// Which crash states a case checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kinds {
    Kill9,
    PowerLoss,
    Both,
}

/// One recorded history and what its checks found.
pub struct Case {
    pub recording: Recording,
    pub runs: Vec<StepRun>,
    pub kill9: Tally,
    pub power: Tally,
    /// Lost-host states (only with metadata shipping: `StorageSettings::metadata_sync`).
    pub host: Tally,
    /// Steps whose outcome differs from the model's (an engine bug outside any crash).
    pub mismatches: Vec<String>,
    pub scope: ScopeId,
    /// Upload groups of the recorded run from which the uploader took unneeded blocks out of the
    /// journal instead of putting them (`engine/unneeded.rs`): their crash points are among those
    /// checked.
    pub drop_groups: usize,
}

impl Case {
    pub fn failures(&self) -> Vec<String> {
        let mut all = self.mismatches.clone();
        all.extend(self.kill9.failures.iter().cloned());
        all.extend(self.power.failures.iter().cloned());
        all.extend(self.host.failures.iter().cloned());
        all
    }
}

/// Where a case's recording starts.
#[derive(Clone, Copy)]
pub enum Start<'a> {
    /// After the storage and the scope were created (their tree is the initial image).
    Opened,
    /// Before anything exists: the storage and the scope are created while recording.
    Nothing,
    /// On a crash image of `scope`, whose tree shows the model after `steps` (the engine recovers
    /// it while recording).
    Seed { image: &'a Image, scope: &'a ScopeId, steps: &'a [Step] },
}

/// Records `steps` under `settings` and checks the crash states `kinds` asks for at `depth`.
pub fn run_case(steps: &[Step], settings: &StorageSettings, kinds: Kinds, depth: u32) -> Case {
    run_case_from(Start::Opened, steps, settings, kinds, depth)
}

/// `run_case` from `start`.
pub fn run_case_from(start: Start, steps: &[Step], settings: &StorageSettings, kinds: Kinds, depth: u32) -> Case {
    let (before, mut rig) = match start {
        Start::Opened => (&[][..], Rig::new(settings)),
        Start::Nothing => (&[][..], Rig::recording_from(settings, None)),
        Start::Seed { image, scope, steps } => (steps, Rig::recording_from(settings, Some((image, scope)))),
    };
    let all: Vec<Step> = before.iter().chain(steps).cloned().collect();
    let (models, outcomes) = prefixes(&all);
    let (models, outcomes) = (&models[before.len()..], &outcomes[before.len()..]);
    let scope = rig.scope.clone();
    let drops = Arc::new(AtomicUsize::new(0));
    let counted = drops.clone();
    let hook = scopefs::testhooks::set_interleave("upload.dropped", scope.as_str(), move || {
        counted.fetch_add(1, Ordering::SeqCst);
    });
    let runs = rig.run(steps);
    drop(hook);
    let drop_groups = drops.load(Ordering::SeqCst);
    let mismatches = runs
        .iter()
        .zip(outcomes)
        .enumerate()
        .filter(|(_, (r, want))| &r.outcome != *want)
        .map(|(i, (r, want))| format!("step {i} {:?}: engine {:?}, model {:?}", r.step, r.outcome, want))
        .collect();
    let (recording, dir) = rig.finish();
    let rt = runtime();
    let base = dir.path().join("images");
    let mut opener = Opener::new(&scope, settings, rt.handle(), &base);
    let kill9 =
        if kinds != Kinds::PowerLoss { check_kill9(&recording, &runs, models, &mut opener) } else { Tally::default() };
    let power = if kinds != Kinds::Kill9 {
        let points = power_points(&recording, &runs, depth);
        check_power_loss(&recording, &runs, models, &points, depth, &mut opener)
    } else {
        Tally::default()
    };
    // With metadata shipping, the kill -9 states seen from another host too: the bucket alone.
    let host = if settings.metadata_sync.is_some() && kinds != Kinds::PowerLoss {
        check_host_loss(&recording, &runs, models, &mut opener)
    } else {
        Tally::default()
    };
    Case { recording, runs, kill9, power, host, mismatches, scope, drop_groups }
}

/// Totals across the cases of one test, printed as it goes.
pub struct Totals {
    pub name: &'static str,
    pub started: Instant,
    pub cases: usize,
    pub ops: usize,
    /// Cases whose recorded run dropped unneeded uploads.
    pub dropping: usize,
    pub kill9: Tally,
    pub power: Tally,
    pub host: Tally,
}

impl Totals {
    pub fn new(name: &'static str) -> Totals {
        let none = Tally::default;
        Totals {
            name,
            started: Instant::now(),
            cases: 0,
            ops: 0,
            dropping: 0,
            kill9: none(),
            power: none(),
            host: none(),
        }
    }

    /// Adds a case (its failures are kept by the caller) and prints its line.
    pub fn add(&mut self, config: &str, steps: usize, case: &Case) {
        self.cases += 1;
        self.ops += case.recording.log.len();
        self.dropping += usize::from(case.drop_groups > 0);
        eprintln!(
            "{} case {} ({config}): {steps} steps, {} ops, {} upload groups with drops; kill -9: {} states, {} held; power loss: {} crash points, {} states ({} distinct), {} held;{} {} failures",
            self.name,
            self.cases,
            case.recording.log.len(),
            case.drop_groups,
            case.kill9.states,
            case.kill9.checks_held,
            case.power.crash_points,
            case.power.states,
            case.power.distinct,
            case.power.checks_held,
            host_part(&case.host),
            case.failures().len()
        );
        self.kill9.add(case.kill9.counts());
        self.power.add(case.power.counts());
        self.host.add(case.host.counts());
    }

    pub fn print(&self) {
        eprintln!(
            "{}: {} cases ({} dropping unneeded uploads), {} ops recorded; kill -9: {} crash points, {} states ({} distinct), {} checks held ({} as a write in flight cut short); power loss: {} crash points, {} states ({} distinct), {} checks held;{} {:.1?}",
            self.name,
            self.cases,
            self.dropping,
            self.ops,
            self.kill9.crash_points,
            self.kill9.states,
            self.kill9.distinct,
            self.kill9.checks_held,
            self.kill9.torn,
            self.power.crash_points,
            self.power.states,
            self.power.distinct,
            self.power.checks_held,
            host_part(&self.host),
            self.started.elapsed()
        );
    }
}

/// The lost-host counts for a report line (nothing when none were checked).
fn host_part(t: &Tally) -> String {
    if t.states == 0 {
        return String::new();
    }
    format!(" host lost: {} states ({} distinct), {} held;", t.states, t.distinct, t.checks_held)
}

/// The proptest configuration of a crash test: `cases` histories from a fixed seed
/// (`SCOPEFS_CRASH_SEED` changes it), no persistence file, bounded shrinking.
pub fn proptest_config(cases: u32, salt: u64) -> Config {
    let seed = std::env::var("SCOPEFS_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5c0f_e5f5_u64) ^ salt;
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        max_shrink_iters: 32,
        max_shrink_time: 60_000,
        ..Config::default()
    }
}

/// The failures of a test for its panic message: how many, and the first ones.
/// (`SCOPEFS_CRASH_VERBOSE=1`: all of them.)
pub fn summary(failures: &[String]) -> String {
    let verbose = std::env::var("SCOPEFS_CRASH_VERBOSE").is_ok_and(|v| v == "1");
    let shown = if verbose { usize::MAX } else { 8 };
    let more = failures.len().saturating_sub(shown);
    let mut out = format!("{} failed checks:\n", failures.len());
    for f in failures.iter().take(shown) {
        out.push_str(f);
        out.push('\n');
    }
    if more > 0 {
        out.push_str(&format!("... and {more} more\n"));
    }
    out
}
