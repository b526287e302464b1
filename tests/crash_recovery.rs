//! Issue 21, item 5: crash states around restarts and recovery, from the recording FUSE layer
//! (tests/crashsim_support): a durability point after a restart, a scope created from nothing,
//! blocks large enough to be object files, and a crash image recovered and then crashed again
//! (every kill -9 state of the recovery and of the work after it).

pub mod crashsim_support;

recorder_process!();

use crashsim_support::check::{bounds, compare};
use crashsim_support::depth;
use crashsim_support::harness::{configs, runtime, settings};
use crashsim_support::image::HashCache;
use crashsim_support::model::{prefixes, Step};
use crashsim_support::runner::{run_case, run_case_from, summary, Kinds, Start, Totals};
use crashsim_support::states::power_loss_family;

fn s(p: &str) -> String {
    p.to_string()
}

/// Runs `steps` from `start` in every configuration, checking both kinds of crash states.
fn all_configs(name: &'static str, start: Start, steps: &[Step]) {
    let mut totals = Totals::new(name);
    let mut failures = Vec::new();
    for (config, settings) in configs() {
        let case = run_case_from(start, steps, &settings, Kinds::Both, depth());
        totals.add(config, steps.len(), &case);
        failures.extend(case.failures().into_iter().map(|f| format!("{config}: {f}")));
    }
    totals.print();
    assert!(failures.is_empty(), "{name}: {}", summary(&failures));
}

/// A file closed before a restart is covered by a durability point after it (fs/SEMANTICS.md:
/// fsync and fsyncdir make every committed change survive a power loss).
#[test]
fn a_durability_point_after_a_restart_covers_files_closed_before_it() {
    let steps = vec![
        Step::Create(s("before")),
        Step::Write(s("before"), 0, 9000, 1),
        Step::Restart,
        Step::Create(s("after")),
        Step::Write(s("after"), 0, 100, 2),
        Step::Fsync(s("after")),
    ];
    all_configs("restart", Start::Opened, &steps);
}

/// A scope created while recording (its directories and databases new): once a file of it was
/// fsynced, a power loss keeps the scope and the file.
#[test]
fn a_new_scope_survives_a_power_loss_after_its_first_fsync() {
    let steps = vec![Step::Create(s("a")), Step::Write(s("a"), 0, 5000, 1), Step::Fsync(s("a")), Step::FsyncDir];
    all_configs("new scope", Start::Nothing, &steps);
}

/// Blocks of 256 KiB: those over the pack's 128 KiB limit are files of the object directory
/// (temporary file, fsync, rename, fsync of the directory).
#[test]
fn blocks_stored_as_object_files_survive_every_crash_state() {
    let steps = vec![
        Step::Create(s("big")),
        Step::Write(s("big"), 0, 600_000, 1),
        Step::Fsync(s("big")),
        Step::Write(s("big"), 300_000, 200_000, 2),
        Step::Mkdir(s("d")),
        Step::Rename(s("big"), s("d/big")),
        Step::WaitUploads,
        Step::Truncate(s("d/big"), 400_000),
        Step::Sync,
    ];
    let mut totals = Totals::new("object files");
    let case = run_case(&steps, &settings(256 * 1024, 0), Kinds::Both, depth());
    totals.add("256k-blocks", steps.len(), &case);
    totals.print();
    let failures = case.failures();
    assert!(failures.is_empty(), "object files: {}", summary(&failures));
}

/// Phase one runs `first`; every power-loss state of its end (depth 1: those without the
/// metadata WAL's unsynced writes, the oldest database a power loss can leave beside a newer
/// redo log, and the two extremes; depth 2+: every state) is opened by a new engine that runs
/// `then`, recorded: every kill -9 state of that recovery and of `then` must show the prefix the
/// crash image showed followed by a prefix of `then`. A replay that adopts a record of a
/// timeline the power loss undid shows up as a tree matching no prefix.
fn recovered_then_crashed(name: &'static str, first: &[Step], then: &[Step]) {
    let depth = depth();
    let mut totals = Totals::new(name);
    let mut failures = Vec::new();
    for (config, settings) in configs() {
        let case = run_case(first, &settings, Kinds::PowerLoss, depth);
        totals.add(config, first.len(), &case);
        failures.extend(case.failures().into_iter().map(|f| format!("{config}, phase one: {f}")));
        let rec = &case.recording;
        let (models, _) = prefixes(first);
        let end = rec.log.len();
        let b = bounds(&case.runs, end);
        let rt = runtime();
        let scratch = crashsim_support::harness::scratch();
        let mut cache = HashCache::default();
        let mut seen = std::collections::HashSet::new();
        for sel in power_loss_family(rec, end, depth) {
            let wanted = depth >= 2
                || sel.label == "all but the data of meta.sqlite3-wal"
                || sel.label == "none of the unsynced ops"
                || sel.label == "all ops";
            let image = sel.build(rec);
            if !wanted || !seen.insert(image.hash(&mut cache)) {
                continue;
            }
            let dir = scratch.path().join(format!("seed-{}", seen.len()));
            image.materialize(&dir).unwrap();
            let obs = crashsim_support::harness::open_rebooted(&dir, &case.scope, &settings, rt.handle());
            // The prefix the image shows exactly (one with a damaged file, or none, is phase one's
            // failure, reported there).
            let Some(k) = obs
                .ok()
                .and_then(|o| (b.durable..=b.hi).rev().find(|k| compare(&o, &models[*k], &|_| false, false).is_ok()))
            else {
                continue;
            };
            let seed = Start::Seed { image: &image, scope: &case.scope, steps: &first[..k] };
            let second = run_case_from(seed, then, &settings, Kinds::Kill9, depth);
            totals.add(config, then.len(), &second);
            failures.extend(
                second
                    .failures()
                    .into_iter()
                    .map(|f| format!("{config}, recovering \"{}\" (prefix {k}): {f}", sel.label)),
            );
        }
    }
    totals.print();
    assert!(failures.is_empty(), "{name}: {}", summary(&failures));
}

/// Equal-sized records (setxattr of same-length values) in a batch committed without a flush,
/// then one more: a power loss that undoes the commit leaves the database a batch behind a redo
/// log whose tail holds the undone batch's records. The recovering engine numbers its batch as
/// the undone one was numbered and writes over the log's start (DURABILITY-REVIEW D2).
#[test]
fn a_recovered_scope_never_replays_records_of_an_undone_batch() {
    let first = vec![
        Step::Create(s("a")),
        Step::FsyncDir,
        Step::SetXattr(s("a"), 1),
        Step::SetXattr(s("a"), 2),
        Step::SetXattr(s("a"), 3),
        Step::Commit,
        Step::SetXattr(s("a"), 4),
    ];
    let then = vec![Step::SetXattr(s("a"), 5)];
    recovered_then_crashed("recovery", &first, &then);
}

/// Files, directories and links recovered from a power loss and then changed again.
#[test]
fn a_recovered_scope_survives_kill9_during_and_after_recovery() {
    let first = vec![
        Step::Create(s("a")),
        Step::Write(s("a"), 0, 5000, 1),
        Step::Mkdir(s("d")),
        Step::FsyncDir,
        Step::Link(s("a"), s("d/b")),
        Step::Write(s("d/b"), 4000, 3000, 2),
        Step::Commit,
        Step::Rename(s("a"), s("c")),
    ];
    let then = vec![Step::Write(s("c"), 0, 100, 3), Step::Unlink(s("d/b")), Step::Create(s("d/e"))];
    recovered_then_crashed("recovery of files", &first, &then);
}
