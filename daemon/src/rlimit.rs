//! The daemon's open-file limit: each mounted scope holds a few descriptors (its FUSE connection,
//! its metadata database with WAL and index, and a copy kept by the service manager), so a host
//! of thousands of scopes needs far more than a login shell's default.

/// Raises `RLIMIT_NOFILE` to `target` where the kernel allows it: the soft limit up to the hard
/// one, and the hard one too when the process may (root), never above the kernel's `nr_open`.
/// Returns the soft limit in force afterwards.
pub fn raise_open_files(target: u64) -> std::io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit with a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(lim.rlim_max);
    let want = target.min(nr_open);
    if lim.rlim_max < want {
        let raised = libc::rlimit { rlim_cur: want, rlim_max: want };
        // SAFETY: setrlimit with a valid struct; refused (EPERM) without CAP_SYS_RESOURCE.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Ok(want);
        }
    }
    let soft = libc::rlimit { rlim_cur: want.min(lim.rlim_max).max(lim.rlim_cur), rlim_max: lim.rlim_max };
    // SAFETY: as above; a soft limit up to the hard one is always allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &soft) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(soft.rlim_cur)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_limit_reaches_the_target_or_the_hard_limit() {
        let mut before = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit with a valid out-pointer.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut before) }, 0);
        let got = super::raise_open_files(before.rlim_cur.max(1024)).unwrap();
        assert!(got >= before.rlim_cur.max(1024).min(before.rlim_max), "{got}");
    }
}
