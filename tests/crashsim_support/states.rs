//! The crash-state constructor: from a recording (initial image and op log) and a crash point
//! `i` (ops `0..i` issued), the kill -9 state (every op applied: the page cache survives a
//! killed process) and a bounded family of power-loss states that POSIX ordering allows (see the
//! module docs of `crashsim_support` for exactly which).

use std::collections::BTreeMap;
use std::ops::Range;

use super::image::Image;
use super::ops::{FileId, Op, Unit};
use super::recorder::Recording;

/// The page size torn writes are cut at.
pub const PAGE: u64 = 4096;
/// Most prefix combinations across two files taken at one crash point (depth 2+).
const MAX_PAIR_PREFIXES: usize = 400;

/// Which ops `0..i` are guaranteed durable at crash point `i`: a file's writes and truncates
/// issued before a completed fsync of that file, a directory's entry operations issued before a
/// completed fsync of that directory (a rename: of either directory it touches). Syncs
/// themselves count as durable (they change nothing).
pub fn durable(log: &[Op], i: usize) -> Vec<bool> {
    let mut synced_later = std::collections::HashSet::new();
    let mut out = vec![false; i];
    for j in (0..i).rev() {
        let op = &log[j];
        if let Some(u) = op.synced_unit() {
            synced_later.insert(u);
            out[j] = true;
        } else {
            out[j] = op.units().iter().any(|u| synced_later.contains(u));
        }
    }
    out
}

/// One power-loss state: which ops of `0..i` persisted, and optionally one write that persisted
/// only in part (op index and the byte range of it, relative to its offset).
#[derive(Clone, Debug)]
pub struct Selection {
    pub label: String,
    pub keep: Vec<bool>,
    pub torn: Option<(usize, Range<usize>)>,
}

impl Selection {
    /// The image: the initial tree with the kept ops (and the torn part) applied in log order.
    pub fn build(&self, rec: &Recording) -> Image {
        let mut image = rec.initial.clone();
        for (j, keep) in self.keep.iter().enumerate() {
            match &self.torn {
                Some((t, range)) if *t == j => image.apply_torn(j, &rec.log[j], range.clone()),
                _ if *keep => image.apply(j, &rec.log[j]),
                _ => {}
            }
        }
        image
    }
}

/// The kill -9 state at every crash point, in order: `f(i, image)` for `i` in `0..=log.len()`.
pub fn each_kill9_state(rec: &Recording, mut f: impl FnMut(usize, &Image)) {
    let mut image = rec.initial.clone();
    for i in 0..=rec.log.len() {
        f(i, &image);
        if let Some(op) = rec.log.get(i) {
            image.apply(i, op);
        }
    }
}

fn name_of(rec: &Recording, u: Unit) -> String {
    match u {
        Unit::Data(f) => format!("data of {}", rec.name(f)),
        Unit::Entries(d) => format!("entries of {}", if d == super::ops::ROOT { "/" } else { rec.name(d) }),
    }
}

/// The power-loss family at crash point `i` for `depth` (module docs of `crashsim_support`).
pub fn power_loss_family(rec: &Recording, i: usize, depth: u32) -> Vec<Selection> {
    let log = &rec.log[..i];
    let base: Vec<bool> = durable(log, i).into_iter().enumerate().map(|(j, d)| d && !rec.lost.contains(&j)).collect();
    let pending: Vec<usize> = (0..i).filter(|j| !base[*j] && !rec.lost.contains(j)).collect();
    let mut units: BTreeMap<Unit, Vec<usize>> = BTreeMap::new();
    for &j in &pending {
        for u in log[j].units() {
            units.entry(u).or_default().push(j);
        }
    }
    let all: Vec<bool> = (0..i).map(|j| !rec.lost.contains(&j)).collect();
    let mut out = vec![
        Selection { label: "none of the unsynced ops".into(), keep: base.clone(), torn: None },
        Selection { label: "all ops".into(), keep: all.clone(), torn: None },
    ];
    let without = |ops: &[&Vec<usize>]| {
        let mut keep = all.clone();
        for list in ops {
            for &j in list.iter() {
                keep[j] = false;
            }
        }
        keep
    };
    for (u, ops) in &units {
        out.push(Selection { label: format!("all but the {}", name_of(rec, *u)), keep: without(&[ops]), torn: None });
        let mut keep = base.clone();
        for &j in ops {
            keep[j] = true;
        }
        out.push(Selection { label: format!("only the {}", name_of(rec, *u)), keep, torn: None });
    }
    let files: Vec<(FileId, &Vec<usize>)> =
        units.iter().filter_map(|(u, ops)| if let Unit::Data(f) = u { Some((*f, ops)) } else { None }).collect();
    for (f, ops) in &files {
        for n in 1..ops.len() {
            let mut keep = without(&[ops]);
            for &j in &ops[..n] {
                keep[j] = true;
            }
            out.push(Selection {
                label: format!("{} of {} unsynced ops of {}", n, ops.len(), rec.name(*f)),
                keep,
                torn: None,
            });
            if depth >= 2 {
                let mut keep = base.clone();
                for &j in &ops[..n] {
                    keep[j] = true;
                }
                out.push(Selection {
                    label: format!("only {} of {} unsynced ops of {}", n, ops.len(), rec.name(*f)),
                    keep,
                    torn: None,
                });
            }
        }
        out.extend(torn(rec, log, *f, ops, &all, depth));
    }
    if depth >= 2 {
        let list: Vec<(&Unit, &Vec<usize>)> = units.iter().collect();
        for a in 0..list.len() {
            for b in a + 1..list.len() {
                let label = format!("all but the {} and the {}", name_of(rec, *list[a].0), name_of(rec, *list[b].0));
                out.push(Selection { label, keep: without(&[list[a].1, list[b].1]), torn: None });
            }
        }
        out.extend(pair_prefixes(rec, &files, &all));
    }
    out
}

/// Each file's last unsynced write torn at 4 KiB boundaries of the file: depth 1 keeps the part
/// before the first boundary and the part after the last one; depth 2+ both sides of every one.
fn torn(rec: &Recording, log: &[Op], f: FileId, ops: &[usize], all: &[bool], depth: u32) -> Vec<Selection> {
    let Some(&w) = ops.iter().rev().find(|&&j| log[j].is_write()) else { return Vec::new() };
    let Op::Write { offset, data, .. } = &log[w] else { return Vec::new() };
    let (start, end) = (*offset, offset + data.len() as u64);
    let cuts: Vec<usize> =
        ((start / PAGE + 1) * PAGE..end).step_by(PAGE as usize).map(|b| (b - start) as usize).collect();
    if cuts.is_empty() {
        return Vec::new();
    }
    let chosen: Vec<usize> = if depth >= 2 { cuts.clone() } else { vec![cuts[0], *cuts.last().unwrap()] };
    let mut out = Vec::new();
    for (k, cut) in chosen.iter().enumerate() {
        let n = data.len();
        let mut keep = all.to_vec();
        keep[w] = false;
        if depth >= 2 || k == 0 {
            let label = format!("last write of {} torn: first {cut} of {n} bytes", rec.name(f));
            out.push(Selection { label, keep: keep.clone(), torn: Some((w, 0..*cut)) });
        }
        if depth >= 2 || k + 1 == chosen.len() {
            let label = format!("last write of {} torn: bytes {cut}.. of {n}", rec.name(f));
            out.push(Selection { label, keep, torn: Some((w, *cut..n)) });
        }
    }
    out
}

/// Prefix `n` of one file's unsynced ops with prefix `m` of another's, everything else
/// persisting (at most `MAX_PAIR_PREFIXES`).
fn pair_prefixes(rec: &Recording, files: &[(FileId, &Vec<usize>)], all: &[bool]) -> Vec<Selection> {
    let mut out = Vec::new();
    for a in 0..files.len() {
        for b in a + 1..files.len() {
            let ((fa, oa), (fb, ob)) = (files[a], files[b]);
            for n in 0..oa.len() {
                for m in 0..ob.len() {
                    if out.len() >= MAX_PAIR_PREFIXES {
                        return out;
                    }
                    let mut keep = all.to_vec();
                    for &j in &oa[n..] {
                        keep[j] = false;
                    }
                    for &j in &ob[m..] {
                        keep[j] = false;
                    }
                    let label = format!(
                        "{n} of {} unsynced ops of {} and {m} of {} of {}",
                        oa.len(),
                        rec.name(fa),
                        ob.len(),
                        rec.name(fb)
                    );
                    out.push(Selection { label, keep, torn: None });
                }
            }
        }
    }
    out
}
