//! Issue 21, item 5 (a, b): kill -9 at every op and power loss at enumerated crash points of
//! recorded engine histories (tests/crashsim_support: the recording FUSE layer, the crash-state
//! constructor, the model); issue 23: with metadata shipped to the bucket, every crash point also
//! as a lost host, restored from the bucket alone. `SCOPEFS_CRASH_DEPTH` (default 1) sets how much
//! is enumerated.

pub mod crashsim_support;

recorder_process!();

use std::cell::RefCell;

use crashsim_support::depth;
use crashsim_support::harness::configs;
use crashsim_support::model::{history, history_held, Step};
use crashsim_support::runner::{proptest_config, run_case, Case, Kinds, Totals};
use proptest::strategy::{BoxedStrategy, Strategy};
use std::sync::Arc;

use crashsim_support::check::{power_verdict, Bounds};
use crashsim_support::harness::{Observed, Seen};
use crashsim_support::image::{HashCache, Image};
use crashsim_support::model::{prefixes, Model, Shown};
use crashsim_support::ops::{Op, ROOT};
use crashsim_support::recorder::Recording;
use crashsim_support::states::{durable, power_loss_family};
use proptest::test_runner::{TestCaseError, TestRunner};

/// Histories per test and their lengths (after a prelude of four steps) at `depth`.
fn sizes(depth: u32) -> (u32, std::ops::Range<usize>) {
    match depth {
        1 => (16, 6..18),
        d => (40 * d, 10..(20 * d as usize)),
    }
}

/// Runs generated histories (alternating configurations), checking `kinds` of crash states (and,
/// with metadata `shipped` to the bucket, the lost-host state of every crash point); fails with
/// the first failures of the (shrunk) history that failed.
fn generated(name: &'static str, kinds: Kinds, salt: u64, shipped: bool) {
    generated_from(name, kinds, salt, shipped, |len| history(len).boxed());
}

/// `generated` over the histories `histories` makes (of lengths in the range it is given).
fn generated_from(
    name: &'static str,
    kinds: Kinds,
    salt: u64,
    shipped: bool,
    histories: fn(std::ops::Range<usize>) -> BoxedStrategy<Vec<Step>>,
) {
    let depth = depth();
    let (cases, len) = sizes(depth);
    let totals = RefCell::new(Totals::new(name));
    let mut runner = TestRunner::new(proptest_config(cases, salt));
    let mut configs = configs();
    if shipped {
        for (_, settings) in &mut configs {
            settings.metadata_sync = Some(std::time::Duration::from_secs(3600));
        }
    }
    let strategy = (histories(len), 0..configs.len());
    let result = runner.run(&strategy, |(steps, c)| {
        let (config, settings) = &configs[c];
        let case: Case = run_case(&steps, settings, kinds, depth);
        totals.borrow_mut().add(config, steps.len(), &case);
        let failures = case.failures();
        if failures.is_empty() {
            return Ok(());
        }
        Err(TestCaseError::fail(format!("{config}: {}", crashsim_support::runner::summary(&failures))))
    });
    totals.borrow().print();
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

#[test]
fn kill9_at_every_op_of_generated_histories() {
    generated("kill -9", Kinds::Kill9, 1, false);
}

/// Issue 21 acceptance c by enumeration: histories that write through handles kept open (what
/// each write was answered for lives in the open-file log until a close commits it), killed at
/// every op; every answered write reads back after each kill, whichever files were open.
#[test]
fn kill9_at_every_op_with_files_held_open() {
    generated_from("kill -9, files held open", Kinds::Kill9, 4, false, |len| history_held(len).boxed());
}

#[test]
fn power_loss_states_of_generated_histories() {
    generated("power loss", Kinds::PowerLoss, 2, false);
}

/// Issue 23 (a lost host): generated histories with metadata shipped to the bucket, every crash
/// point restored from the bucket alone on another host (and killed on its own).
#[test]
fn lost_host_states_of_generated_histories() {
    generated("bucket alone", Kinds::Kill9, 3, true);
}

fn s(p: &str) -> String {
    p.to_string()
}

/// A history touching every kind of step once, online gc twice: the overwritten first block is
/// uploaded and unreferenced when the first pass runs, which deletes it.
fn fixed_history() -> Vec<Step> {
    vec![
        Step::Create(s("a")),
        Step::Write(s("a"), 0, 5000, 1),
        Step::Mkdir(s("x")),
        Step::Fsync(s("a")),
        Step::Write(s("a"), 100, 300, 2),
        Step::Rename(s("a"), s("x/b")),
        Step::SetXattr(s("x/b"), 3),
        Step::FsyncDir,
        Step::Link(s("x/b"), s("c")),
        Step::WaitUploads,
        Step::Gc,
        Step::Truncate(s("c"), 4500),
        Step::Unlink(s("x/b")),
        Step::Sync,
        Step::Rmdir(s("x")),
        Step::Gc,
    ]
}

/// Runs `steps` in both configurations (with metadata shipped to the bucket when `shipped`),
/// checking `kinds`; fails with every failed check. Returns each configuration's upload groups
/// with drops.
fn fixed(name: &'static str, steps: &[Step], kinds: Kinds, shipped: bool) -> Vec<(&'static str, usize)> {
    let mut totals = Totals::new(name);
    let mut failures = Vec::new();
    let mut drops = Vec::new();
    for (config, mut settings) in configs() {
        if shipped {
            settings.metadata_sync = Some(std::time::Duration::from_secs(3600));
        }
        let case = run_case(steps, &settings, kinds, depth());
        totals.add(config, steps.len(), &case);
        assert!(!shipped || case.host.states > 0, "no lost-host state was checked");
        failures.extend(case.failures().into_iter().map(|f| format!("{config}: {f}")));
        drops.push((config, case.drop_groups));
    }
    totals.print();
    assert!(failures.is_empty(), "{}", crashsim_support::runner::summary(&failures));
    drops
}

/// The fixed history in both configurations: kill -9 and power loss.
#[test]
fn a_fixed_history_survives_every_crash_state() {
    fixed("fixed history", &fixed_history(), Kinds::Both, false);
}

/// Small blocks no file refers to any more when the uploader reaches them (a file deleted, one
/// rewritten, one truncated; before and after a restart) are taken out of the journal, not put
/// (`engine/unneeded.rs`): at every crash point of that, kill -9 and power loss, every file reads
/// as the model says and nothing refers to a block that is gone. Only inline blocks are dropped:
/// a staging file's block is uploaded and gc collects it.
#[test]
fn unneeded_uploads_dropped_survive_every_crash_state() {
    let steps = vec![
        Step::Create(s("a")),
        Step::Write(s("a"), 0, 600, 1),
        Step::Create(s("b")),
        Step::Write(s("b"), 0, 700, 2),
        Step::Commit,
        Step::Write(s("b"), 0, 700, 3),
        Step::Unlink(s("a")),
        Step::Create(s("c")),
        Step::Write(s("c"), 0, 500, 4),
        Step::WaitUploads,
        Step::FsyncDir,
        Step::Write(s("c"), 0, 300, 5),
        Step::Unlink(s("b")),
        Step::Create(s("d")),
        Step::Write(s("d"), 0, 800, 6),
        Step::Truncate(s("d"), 100),
        Step::Restart,
        Step::WaitUploads,
        Step::Sync,
        Step::Gc,
    ];
    let drops = fixed("unneeded uploads", &steps, Kinds::Both, false);
    assert_eq!(drops.len(), 2);
    for (config, groups) in drops {
        match config {
            "inline-1k" => assert!(
                groups >= 2,
                "{config}: {groups} upload groups dropped blocks, not one before and one after the restart"
            ),
            _ => assert_eq!(groups, 0, "{config}: a staging file's block was dropped"),
        }
    }
}

/// The durable set follows POSIX ordering: a file's data before a completed fsync of it, a
/// directory's entries before a completed fsync of it (a rename: of either directory).
#[test]
fn durable_ops_follow_posix_ordering() {
    let log = synthetic_log();
    let d = durable(&log, log.len());
    let kinds: Vec<(&str, bool)> = log.iter().zip(&d).map(|(op, d)| (op.kind(), *d)).collect();
    assert_eq!(
        kinds,
        vec![
            ("create", true),
            ("write", true),
            ("fsync", true),
            ("write", false),
            ("fsync-dir", true),
            ("mkdir", false),
            ("create", false),
            ("write", false),
            ("write", false),
            ("rename", false),
        ]
    );
    // Crash before the fsync of the directory: the creation of f is not durable yet.
    assert!(!durable(&log, 4)[0], "a create is durable only once its directory is synced");
    assert!(durable(&log, 4)[1], "f's first write was fsynced");
}

/// Ops: create f, write f (5000 bytes), fsync f, write f, fsync /, mkdir d, create g, two
/// writes to g, rename f -> d/f.
fn synthetic_log() -> Vec<Op> {
    let (f, d, g) = (10, 11, 12);
    let w = |file, offset, n: usize, b: u8| Op::Write { file, offset, data: Arc::from(vec![b; n]) };
    vec![
        Op::Create { dir: ROOT, name: "f".into(), file: f },
        w(f, 0, 5000, 1),
        Op::Fsync { file: f, datasync: false },
        w(f, 4000, 5000, 2),
        Op::FsyncDir { dir: ROOT },
        Op::Mkdir { dir: ROOT, name: "d".into(), new: d },
        Op::Create { dir: ROOT, name: "g".into(), file: g },
        w(g, 0, 100, 3),
        w(g, 100, 100, 4),
        Op::Rename {
            from_dir: ROOT,
            from_name: "f".into(),
            to_dir: d,
            to_name: "f".into(),
            file: f,
            other: None,
            flags: 0,
        },
    ]
}

/// The depth-1 family of the synthetic log, state by state.
#[test]
fn the_depth_one_family_is_as_documented() {
    let rec = Recording {
        initial: Image::empty(),
        log: synthetic_log(),
        names: Default::default(),
        lost: Default::default(),
    };
    let n = rec.log.len();
    let family = power_loss_family(&rec, n, 1);
    let image = |label: &str| {
        let sel = family.iter().find(|s| s.label == label).unwrap_or_else(|| panic!("no state {label:?}"));
        sel.build(&rec)
    };
    let f_synced = vec![1u8; 5000];
    let mut f_all = f_synced.clone();
    f_all.truncate(4000);
    f_all.extend(vec![2u8; 5000]);
    let none = image("none of the unsynced ops");
    assert_eq!(none.read("f"), Some(&f_synced[..]), "f: its fsynced content, under its durable name");
    assert_eq!((none.read("g"), none.read("d/f")), (None, None));
    let all = image("all ops");
    assert_eq!(all.read("d/f"), Some(&f_all[..]));
    assert_eq!(all.read("g"), Some(&[vec![3u8; 100], vec![4u8; 100]].concat()[..]));
    assert_eq!(all.read("f"), None);
    let mut kill9 = Image::empty();
    for (j, op) in rec.log.iter().enumerate() {
        kill9.apply(j, op);
    }
    let mut cache = HashCache::default();
    assert_eq!(all.hash(&mut cache), kill9.hash(&mut cache), "\"all ops\" is the kill -9 state");
    let one = image("1 of 2 unsynced ops of ?");
    assert_eq!(one.read("g"), Some(&[3u8; 100][..]), "a prefix of g's writes");
    // f's last write spans the file's 4 KiB boundaries at 4096 and 8192: torn after the first,
    // and before the last.
    let head = image("last write of ? torn: first 96 of 5000 bytes");
    let mut want = f_synced.clone();
    want[4000..].copy_from_slice(&[2u8; 1000][..]);
    want.truncate(4096);
    want[..4000].copy_from_slice(&f_synced[..4000]);
    assert_eq!(&head.read("d/f").unwrap()[..4096], &want[..]);
    assert_eq!(head.read("d/f").unwrap()[4096..], f_synced[4096..]);
    let tail = image("last write of ? torn: bytes 4192.. of 5000");
    let tf = tail.read("d/f").unwrap();
    assert_eq!((tf.len(), &tf[4000..8192]), (9000, &[&f_synced[4000..], &vec![0u8; 3192][..]].concat()[..]));
    assert_eq!(&tf[8192..], &[2u8; 808][..]);
    // Per unit: without and only; the labels say which.
    for label in ["all but the entries of /", "only the entries of /", "all but the data of ?", "only the data of ?"] {
        image(label);
    }
    let distinct: std::collections::HashSet<_> = family.iter().map(|s| s.build(&rec).hash(&mut cache)).collect();
    eprintln!("synthetic log: {} states at depth 1, {} distinct", family.len(), distinct.len());
    assert!(power_loss_family(&rec, n, 2).len() > family.len(), "depth 2 enumerates more");
}

/// A tree that matches no prefix of the history (here: a later step's effect without an
/// earlier one's, as a stale or foreign redo record replayed would leave) is caught.
#[test]
fn a_tree_matching_no_prefix_is_caught() {
    let steps = vec![
        Step::Create(s("a")),
        Step::Fsync(s("a")),
        Step::Write(s("a"), 0, 100, 1),
        Step::Create(s("b")),
        Step::Write(s("b"), 0, 10, 2),
    ];
    let (models, _) = prefixes(&steps);
    let as_observed = |m: &Model| Observed {
        tree: m
            .shown()
            .into_iter()
            .map(|(p, v)| {
                let seen = match v {
                    Shown::Dir { xattr } => Seen::Dir { xattr },
                    Shown::File { data, xattr } => Seen::File { data: Ok(data), xattr },
                };
                (p, seen)
            })
            .collect(),
        link_sets: m.link_sets(),
        damaged: Vec::new(),
        problems: Vec::new(),
        orphans: 0,
    };
    let b = Bounds { done: 5, hi: 5, durable: 2 };
    for k in 2..=5 {
        assert_eq!(power_verdict(&as_observed(&models[k]), &models, b), Ok(()), "prefix {k} is allowed");
    }
    assert!(power_verdict(&as_observed(&models[0]), &models, b).is_err(), "a prefix before the fsync");
    // b created and written, but a's write (an earlier step) missing.
    let mut skipped = Model::default();
    for (i, st) in steps.iter().enumerate().filter(|(i, _)| *i != 2) {
        let _ = skipped.apply(st, i);
    }
    let err = power_verdict(&as_observed(&skipped), &models, b).expect_err("a skipped step is caught");
    assert!(err.contains("a: wrong bytes"), "{err}");
    // A file that reads EIO is allowed only if written after the durability point.
    let mut eio = as_observed(&models[5]);
    eio.tree.insert(s("b"), Seen::File { data: Err("Corrupt".into()), xattr: None });
    assert_eq!(power_verdict(&eio, &models, b), Ok(()));
    let strict = Bounds { durable: 5, ..b };
    assert!(power_verdict(&eio, &models, strict).is_err(), "EIO of a file covered by a durability point");
}

/// Issue 23 (a lost host) by enumeration: the fixed history, then a rewrite, a gc pass and an
/// fsync, with metadata shipped to the bucket (only at durability points, so the bucket's states
/// are the history's own), and at every crash point the bucket alone restored on another host.
/// Everything before the last durability point is there, names and bytes; nothing shows that no
/// prefix of the history shows.
#[test]
fn the_bucket_alone_restores_every_crash_point_of_a_fixed_history() {
    let mut steps = fixed_history();
    steps.extend([Step::Write(s("c"), 0, 6000, 4), Step::Gc, Step::Fsync(s("c"))]);
    fixed("bucket alone", &steps, Kinds::Kill9, true);
}
