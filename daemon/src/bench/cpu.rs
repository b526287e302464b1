//! The CPU time processes spent while a workload ran (`--daemon-pid`, `--cpu-pid`): user plus
//! system time from `/proc/PID/stat`, a cost that a busy two-core machine's wall time hides.

use std::fs;

use anyhow::{Context, Result};
use serde::Serialize;

/// CPU seconds the watched processes spent during one workload.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadCpu {
    pub workload: String,
    /// One figure per watched pid, in the order given (the daemon's first).
    pub seconds: Vec<f64>,
}

/// The watched processes' CPU clock ticks so far, one per pid.
pub(super) fn ticks(pids: &[u32]) -> Result<Vec<u64>> {
    pids.iter()
        .map(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
                .with_context(|| format!("cannot read the CPU time of pid {pid}"))?;
            parse_ticks(&stat).with_context(|| format!("pid {pid}'s stat has no CPU times"))
        })
        .collect()
}

/// Seconds between two `ticks` readings of the same pids.
pub(super) fn seconds_between(before: &[u64], after: &[u64]) -> Vec<f64> {
    // SAFETY: sysconf only reads a constant of the system.
    let per_second = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        n if n > 0 => n as f64,
        _ => 100.0,
    };
    before.iter().zip(after).map(|(b, a)| a.saturating_sub(*b) as f64 / per_second).collect()
}

/// utime + stime of a `/proc/PID/stat` line (fields 14 and 15; the name in field 2 may hold
/// spaces and parentheses, so fields are counted from its last `)`).
fn parse_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_are_read_after_a_name_with_spaces_and_parentheses() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 100 0 0";
        assert_eq!(parse_ticks(stat), Some(325));
        assert_eq!(parse_ticks("42 (x) S 1"), None);
        assert_eq!(seconds_between(&[100, 5], &[100, 5]), vec![0.0, 0.0]);
    }

    #[test]
    fn this_process_spends_cpu_time_when_it_works() {
        let me = [std::process::id()];
        let before = ticks(&me).unwrap();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        // Busy until the clock ticks at least twice (a tick is 10 ms at the usual CLK_TCK).
        while ticks(&me).unwrap()[0] < before[0] + 2 {
            x = x.wrapping_mul(31).wrapping_add(1);
            assert!(start.elapsed().as_secs() < 30, "no CPU time counted in 30 s of work");
        }
        assert!(seconds_between(&before, &ticks(&me).unwrap())[0] > 0.0, "{x}");
    }
}
