//! Issue 21, item 5 (c): disk faults. A fixed workload is recorded once through the recording
//! FUSE layer (tests/crashsim_support); then, for every write and every sync the baseline issued,
//! it runs again with that request failing once with `ENOSPC` and once with `EIO` (not
//! performed). No panic, no hang; every call that returned Ok shows after a restart; a power
//! loss keeps what the last successful durability point covered; and a full disk is reported as
//! such (`EngineError::NoSpace`).

pub mod crashsim_support;

recorder_process!();

use std::sync::OnceLock;
use std::time::Instant;

use crashsim_support::depth;
use crashsim_support::faults::{faulted_run, workload, Campaign};
use crashsim_support::harness::{settings, Rig};
use crashsim_support::ops::FaultOn;
use crashsim_support::runner::summary;

/// `SCOPEFS_CRASH_FAULT=write:K:ENOSPC` (or `sync:K:EIO`, ...): run that fault point alone.
fn only_point() -> Option<(FaultOn, i32)> {
    let v = std::env::var("SCOPEFS_CRASH_FAULT").ok()?;
    let mut parts = v.split(':');
    let (kind, k, errno) = (parts.next()?, parts.next()?.parse().ok()?, parts.next()?);
    let on = if kind == "write" { FaultOn::Write(k) } else { FaultOn::Sync(k) };
    Some((on, if errno == "ENOSPC" { libc::ENOSPC } else { libc::EIO }))
}

/// The campaign, run once for the tests of this file.
fn campaign() -> &'static Campaign {
    static CAMPAIGN: OnceLock<Campaign> = OnceLock::new();
    CAMPAIGN.get_or_init(|| {
        let started = Instant::now();
        let depth = depth();
        let settings = settings(4096, 1024);
        let steps = workload();
        let mut rig = Rig::new(&settings);
        let baseline = rig.run(&steps);
        assert!(baseline.iter().all(|r| r.outcome.is_ok()), "the workload runs cleanly: {baseline:?}");
        let (writes, syncs) = rig.recorder().counts();
        drop(rig.finish());
        let mut points: Vec<(FaultOn, i32)> = Vec::new();
        for on in (0..writes).map(FaultOn::Write).chain((0..syncs).map(FaultOn::Sync)) {
            points.push((on, libc::ENOSPC));
            points.push((on, libc::EIO));
        }
        if let Some(only) = only_point() {
            points.retain(|p| *p == only);
        }
        let mut campaign = Campaign { runs: Vec::new(), baseline: (writes, syncs) };
        let verbose = std::env::var("SCOPEFS_CRASH_VERBOSE").is_ok_and(|v| v == "1");
        for (n, (on, errno)) in points.iter().enumerate() {
            if verbose {
                eprintln!("disk faults: {on:?} errno {errno} ({:.1?})", started.elapsed());
            }
            campaign.runs.push(faulted_run(&settings, &steps, *on, *errno, depth));
            if n % 50 == 49 {
                eprintln!("disk faults: {} of {} fault points run ({:.1?})", n + 1, points.len(), started.elapsed());
            }
        }
        campaign.print(started.elapsed());
        campaign
    })
}

#[test]
fn every_fault_leaves_a_state_the_model_explains() {
    let failures: Vec<String> = campaign().runs.iter().flat_map(|r| r.failures.iter().cloned()).collect();
    assert!(failures.is_empty(), "{}", summary(&failures));
}

/// A full disk met anywhere (a write or a flush of a staging file, the metadata database, its
/// redo log, the object directory) is reported as `NoSpace` (ENOSPC), never as a generic I/O
/// error, by the call that met it. A failed flush may have lost pages (`fsyncgate`): the calls
/// after it may answer `EIO` as the poisoning rules say (`Poisoned`, `WriteLost`), nothing else.
#[test]
fn a_full_disk_is_reported_as_no_space() {
    let wrong: Vec<String> = campaign()
        .runs
        .iter()
        .filter(|r| r.errno == libc::ENOSPC)
        .flat_map(|r| {
            let after_flush = matches!(r.on, FaultOn::Sync(_));
            r.errors
                .iter()
                .enumerate()
                .filter(move |(n, (_, e))| {
                    let later_eio = *n > 0 && after_flush && (e == "io:Poisoned" || e == "io:WriteLost");
                    e != "io:NoSpace" && !later_eio
                })
                .map(move |(_, (step, e))| {
                    format!("ENOSPC at {:?} ({}): step {step} failed with {e}", r.on, r.fired.as_deref().unwrap_or("?"))
                })
        })
        .collect();
    assert!(wrong.is_empty(), "{}", summary(&wrong));
}
