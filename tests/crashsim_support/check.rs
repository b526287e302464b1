//! Checking crash states against the model: which prefixes of the history a state at crash point
//! `i` may show, the comparison of an opened image with a model state (paths, kinds, contents,
//! `user.k` attributes, hard links, fsck findings), and the drivers that build, deduplicate,
//! open and check every kill -9 state, every power-loss state and (with metadata shipping) every
//! lost-host state of a recording, with counts.

use std::collections::HashMap;
use std::path::Path;

use scopefs::engine::StorageSettings;
use scopefs::ids::ScopeId;

use super::harness::{
    image_dir, open_and_observe, open_host_lost, open_rebooted, Observation, Observed, Seen, StepRun,
};
use super::image::{HashCache, Image};
use super::model::{Model, Shown, Step};
use super::recorder::Recording;
use super::states::{each_kill9_state, power_loss_family};

/// The prefixes of the history a state at crash point `i` may show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Steps completed (returned) before `i`.
    pub done: usize,
    /// `done`, plus one when a step was in flight at `i` (some of its ops issued).
    pub hi: usize,
    /// Steps before the last durability point (fsync, fsync of a directory, sync) that
    /// completed with Ok before `i`: a power loss keeps at least these.
    pub durable: usize,
}

pub fn bounds(runs: &[StepRun], i: usize) -> Bounds {
    let done = runs.iter().take_while(|r| r.end <= i).count();
    let inflight = runs.get(done).is_some_and(|r| r.begin < i);
    let durable = runs[..done].iter().rposition(|r| r.step.is_durability_point() && r.outcome.is_ok()).unwrap_or(0);
    Bounds { done, hi: done + usize::from(inflight), durable }
}

/// Read errors that mean "I/O error" to an application (never wrong bytes).
fn is_io_error(variant: &str) -> bool {
    matches!(variant, "Corrupt" | "Store" | "Io")
}

fn first_difference(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()))
}

/// Whether `obs` is what `model` shows. `may_fail(path)`: the file may read an I/O error instead
/// (and fsck may name it). `exact`: fsck must not even find orphan objects. `Err`: the first
/// difference (names and sizes only, never contents).
pub fn compare(obs: &Observed, model: &Model, may_fail: &dyn Fn(&str) -> bool, exact: bool) -> Result<(), String> {
    let want = model.shown();
    let missing: Vec<&String> = want.keys().filter(|p| !obs.tree.contains_key(*p)).collect();
    let extra: Vec<&String> = obs.tree.keys().filter(|p| !want.contains_key(*p)).collect();
    if !missing.is_empty() || !extra.is_empty() {
        return Err(format!("paths missing {missing:?}, unexpected {extra:?}"));
    }
    for (p, w) in &want {
        match (w, &obs.tree[p]) {
            (Shown::Dir { xattr }, Seen::Dir { xattr: got }) if xattr == got => {}
            (Shown::Dir { .. }, Seen::Dir { .. }) => return Err(format!("{p}: directory's user.k differs")),
            (Shown::File { data, xattr }, Seen::File { data: got, xattr: got_x }) => {
                if xattr != got_x {
                    return Err(format!("{p}: user.k differs"));
                }
                match got {
                    Ok(g) if g == data => {}
                    Ok(g) => {
                        return Err(format!(
                            "{p}: wrong bytes: {} bytes, model has {} (first difference at byte {})",
                            g.len(),
                            data.len(),
                            first_difference(g, data)
                        ))
                    }
                    Err(v) if is_io_error(v) && may_fail(p) => {}
                    Err(v) => return Err(format!("{p}: read failed ({v}) where the model has {} bytes", data.len())),
                }
            }
            (w, got) => return Err(format!("{p}: kind differs (model {w:?}, found {got:?})").replace('\n', " ")),
        }
    }
    if obs.link_sets != model.link_sets() {
        return Err(format!("hard links differ: found {:?}, model {:?}", obs.link_sets, model.link_sets()));
    }
    if let Some(d) = obs.damaged.iter().find(|p| !may_fail(p)) {
        return Err(format!("fsck names {d} damaged (all damaged: {:?})", obs.damaged));
    }
    if !obs.problems.is_empty() {
        return Err(format!("metadata problems: {:?}", obs.problems));
    }
    if exact && obs.orphans > 0 {
        return Err(format!("fsck finds {} orphan objects", obs.orphans));
    }
    Ok(())
}

/// Counts of one run of checks, and what failed.
#[derive(Debug, Default)]
pub struct Tally {
    pub crash_points: usize,
    pub states: usize,
    pub distinct: usize,
    pub checks_held: usize,
    /// Kill -9 states that held only as a write in flight cut short (`torn_write`).
    pub torn: usize,
    pub failures: Vec<String>,
}

impl Tally {
    /// Counts one check: held, or a failure described by `what` and its reason.
    fn count(&mut self, verdict: Result<(), String>, what: impl FnOnce() -> String) {
        match verdict {
            Ok(()) => self.checks_held += 1,
            Err(e) => self.failures.push(format!("{}: {e}", what())),
        }
    }

    /// The counts alone.
    pub fn counts(&self) -> Tally {
        Tally { failures: Vec::new(), ..*self }
    }

    pub fn add(&mut self, other: Tally) {
        self.crash_points += other.crash_points;
        self.states += other.states;
        self.distinct += other.distinct;
        self.checks_held += other.checks_held;
        self.torn += other.torn;
        self.failures.extend(other.failures);
    }
}

/// Opens images through a cache keyed by content hash: each distinct image is written out and
/// opened once.
pub struct Opener<'a> {
    pub scope: &'a ScopeId,
    pub settings: &'a StorageSettings,
    pub rt: &'a tokio::runtime::Handle,
    pub base: &'a Path,
    cache: HashMap<([u8; 32], Start), Observation>,
    hashes: HashCache,
}

/// How the next process starts on a crash image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Start {
    /// The same host, its files as the killed process left them.
    Killed,
    /// The same host after a power loss (the next boot).
    Rebooted,
    /// Another host: only the bucket (`objects/`) is left; the data directory is gone.
    HostLost,
}

impl<'a> Opener<'a> {
    pub fn new(
        scope: &'a ScopeId,
        settings: &'a StorageSettings,
        rt: &'a tokio::runtime::Handle,
        base: &'a Path,
    ) -> Self {
        Opener { scope, settings, rt, base, cache: HashMap::new(), hashes: HashCache::default() }
    }

    /// The observation of `image` (opened by the next process, by the next boot's after a power
    /// loss, or by another host from the bucket alone: `start`), and whether it was new.
    pub fn open(&mut self, image: &Image, start: Start) -> (&Observation, bool) {
        let key = (image.hash(&mut self.hashes), start);
        let fresh = !self.cache.contains_key(&key);
        if fresh {
            let dir = image_dir(self.base, self.cache.len());
            let open = match start {
                Start::Killed => open_and_observe,
                Start::Rebooted => open_rebooted,
                Start::HostLost => open_host_lost,
            };
            // A scope that ships metadata leaves its shipper's task waiting for its next tick
            // (an hour here), holding the storage and its files: such an image gets a runtime of
            // its own, shut down after it (thousands of images would otherwise run out of files).
            let own = self.settings.metadata_sync.map(|_| super::harness::runtime());
            let rt = own.as_ref().map_or(self.rt, |r| r.handle());
            let obs = match image.materialize(&dir) {
                Ok(()) => open(&dir, self.scope, self.settings, rt),
                Err(e) => Err(format!("writing the image failed: {e}")),
            };
            if let Some(r) = own {
                r.shutdown_timeout(std::time::Duration::from_secs(10));
            }
            let _ = std::fs::remove_dir_all(&dir);
            if let (Err(_), Some(keep)) = (&obs, std::env::var_os("SCOPEFS_CRASH_KEEP")) {
                // A failing image kept as it was before it was opened, for a look by hand.
                let _ = image.materialize(&image_dir(Path::new(&keep), self.cache.len()));
            }
            self.cache.insert(key, obs);
        }
        (&self.cache[&key], fresh)
    }

    pub fn distinct(&self) -> usize {
        self.cache.len()
    }
}

/// What op `i - 1` (the last one issued before crash point `i`) was, for reports.
pub fn last_op(rec: &Recording, i: usize) -> String {
    match i.checked_sub(1).and_then(|j| rec.log.get(j)) {
        Some(op) => format!("after op {} ({} of {})", i - 1, op.kind(), rec.name(op.subject())),
        None => "before any op".into(),
    }
}

fn step_at(runs: &[StepRun], b: Bounds) -> String {
    match runs.get(b.done) {
        Some(r) if b.hi > b.done => format!("step {} {:?} in flight", b.done, r.step),
        _ => format!("{} steps done", b.done),
    }
}

/// A write in flight at the crash (never answered) may have reached part of its range, as a
/// write cut short by a crash may on any file system: its file may show, inside the written range,
/// old or new bytes, at its size before or after the write; every other byte, and everything else,
/// exactly as the model has it. (A write to a file held open changes, in place, a block's working
/// file that the open-file log names for the file's earlier answered writes.)
fn torn_write(o: &Observed, runs: &[StepRun], models: &[Model], b: Bounds) -> Result<(), String> {
    let step = runs.get(b.done).filter(|_| b.hi > b.done).map(|r| &r.step);
    let Some(Step::Write(p, off, len, _) | Step::WriteHeld(p, off, len, _)) = step else {
        return Err("no write in flight".into());
    };
    let (Some(old), Some(new)) = (models[b.done].content(p), models[b.hi].content(p)) else {
        return Err(format!("{p}: not a file before and after the write"));
    };
    let Some(Seen::File { data: Ok(got), .. }) = o.tree.get(p) else {
        return Err(format!("{p}: not a readable file"));
    };
    if got.len() != old.len() && got.len() != new.len() {
        return Err(format!("{p}: {} bytes, neither the size before nor after the write", got.len()));
    }
    let range = *off as usize..(*off + *len) as usize;
    let wrong = got.iter().enumerate().position(|(i, byte)| {
        *byte != old.get(i).copied().unwrap_or(0) && !(range.contains(&i) && new.get(i) == Some(byte))
    });
    if let Some(i) = wrong {
        return Err(format!("{p}: byte {i} is neither what it was nor, inside the write, what was written"));
    }
    compare(o, &models[b.hi].with_content(p, got.clone()), &|_| false, true)
}

/// Every kill -9 state of `rec`: must show the model after the steps completed, or after the
/// step in flight, exactly (a write in flight: or torn, `torn_write`), with a clean fsck.
pub fn check_kill9(rec: &Recording, runs: &[StepRun], models: &[Model], opener: &mut Opener) -> Tally {
    let mut t = Tally::default();
    each_kill9_state(rec, |i, image| {
        t.crash_points += 1;
        t.states += 1;
        let b = bounds(runs, i);
        let (obs, _) = opener.open(image, Start::Killed);
        let verdict = match obs {
            Err(e) => Err(e.clone()),
            Ok(o) => {
                let exact = |k: usize| compare(o, &models[k], &|_| false, true);
                exact(b.done).or_else(|e| if b.hi > b.done { exact(b.hi) } else { Err(e) }).or_else(|e| {
                    let torn = torn_write(o, runs, models, b).map_err(|torn| format!("{e} (torn: {torn})"));
                    t.torn += usize::from(torn.is_ok());
                    torn
                })
            }
        };
        match verdict {
            Ok(()) => t.checks_held += 1,
            Err(e) => t.failures.push(format!("kill -9 {} ({}): {e}", last_op(rec, i), step_at(runs, b))),
        }
    });
    t.distinct = opener.distinct();
    t
}

/// The power-loss family of every crash point in `points`: each must show the model after a
/// prefix `k` with `durable <= k <= hi`; files written at or after step `durable` may read EIO
/// (and only those may fsck name).
pub fn check_power_loss(
    rec: &Recording,
    runs: &[StepRun],
    models: &[Model],
    points: &[usize],
    depth: u32,
    opener: &mut Opener,
) -> Tally {
    let mut t = Tally::default();
    let before = opener.distinct();
    for &i in points {
        t.crash_points += 1;
        let b = bounds(runs, i);
        for sel in power_loss_family(rec, i, depth) {
            t.states += 1;
            let image = sel.build(rec);
            let (obs, _) = opener.open(&image, Start::Rebooted);
            let what = || {
                format!(
                    "power loss {} ({}; {} steps durable), state \"{}\"",
                    last_op(rec, i),
                    step_at(runs, b),
                    b.durable,
                    sel.label
                )
            };
            t.count(obs.as_ref().map_err(Clone::clone).and_then(|o| power_verdict(o, models, b)), what);
        }
    }
    t.distinct = opener.distinct() - before;
    t
}

/// Every lost-host state of `rec` (metadata shipped to the bucket): the bucket as it is at each
/// crash point, restored on another host. Must show a prefix `k`, `durable <= k <= hi`: a
/// durability point returns only once everything before it is in the bucket, names and blocks;
/// files written after it may read EIO (their blocks may never have been uploaded).
pub fn check_host_loss(rec: &Recording, runs: &[StepRun], models: &[Model], opener: &mut Opener) -> Tally {
    let mut t = Tally::default();
    let before = opener.distinct();
    each_kill9_state(rec, |i, image| {
        t.crash_points += 1;
        t.states += 1;
        let b = bounds(runs, i);
        let (obs, _) = opener.open(image, Start::HostLost);
        let what = || format!("host lost {} ({}; {} steps durable)", last_op(rec, i), step_at(runs, b), b.durable);
        t.count(obs.as_ref().map_err(Clone::clone).and_then(|o| power_verdict(o, models, b)), what);
    });
    t.distinct = opener.distinct() - before;
    t
}

/// Whether `o` shows some prefix `k`, `durable <= k <= hi`; otherwise how it differs from each
/// (the newest first).
pub fn power_verdict(o: &Observed, models: &[Model], b: Bounds) -> Result<(), String> {
    let mut diffs = Vec::new();
    for k in (b.durable..=b.hi).rev() {
        let m = &models[k];
        let may_fail = |p: &str| m.last_write(p).is_some_and(|w| w >= b.durable);
        match compare(o, m, &may_fail, false) {
            Ok(()) => return Ok(()),
            Err(e) => diffs.push(format!("after {k} steps: {e}")),
        }
    }
    Err(format!("matches no prefix {}..={}; {}", b.durable, b.hi, diffs.join("; ")))
}
