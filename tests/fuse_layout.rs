//! Mount layout through real FUSE mounts: the real mount (what containers bind) resolves symlinks
//! as POSIX says (a venv works), the host view is a `nosymfollow,nosuid,nodev` bind of it, and
//! unmounting ends even when another bind of the mount survives (its FUSE connection is aborted).

#[path = "support/fuse_harness.rs"]
pub mod harness;

use std::fs;
use std::path::Path;
use std::time::Duration;

use harness::*;
use scopefs_fs::MountOptions;

fn harness() -> Harness {
    Harness::new(small_block_settings(), MountOptions::default())
}

/// The mountinfo line of the mount at `path`.
fn mount_line(path: &Path) -> Option<String> {
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap();
    table.lines().find(|l| l.split(' ').nth(4) == Some(path.to_str().unwrap())).map(str::to_string)
}

#[test]
fn a_venv_on_the_real_mount_uses_symlinks_and_runs() {
    let h = harness();
    let (e, m) = h.scope(big_quota());
    let out = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(m.join("v"))
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "venv failed: {}", String::from_utf8_lossy(&out.stderr));
    // Linux's default: bin/python3 is a symlink (an absolute target, or a chain to one).
    let py = m.join("v/bin/python3");
    assert!(fs::symlink_metadata(&py).unwrap().file_type().is_symlink(), "bin/python3 is not a symlink");
    let out = std::process::Command::new(&py).args(["-c", "import sys; print(sys.prefix)"]).output().unwrap();
    assert!(out.status.success(), "venv python failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), m.join("v").to_str().unwrap());
    // The host view shows the link but does not follow it.
    let view = h.mounts.mountpoint(e.scope_id());
    assert_eq!(fs::read_link(view.join("v/bin/python3")).unwrap(), fs::read_link(&py).unwrap());
    let err = std::process::Command::new(view.join("v/bin/python3")).arg("-c").arg("1").output().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "exec through the view: {err}");
}

#[test]
fn the_host_view_is_a_nosymfollow_bind_of_a_root_only_real_mount() {
    let h = harness();
    let (e, real) = h.scope(big_quota());
    let view = h.mounts.mountpoint(e.scope_id());
    assert_eq!(real, h.mounts.real_mountpoint(e.scope_id()));
    assert!(!real.starts_with(h.mounts.mount_root()), "the real mount is listed in the mount root");
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(h.mounts.real_root()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the real mounts' directory is root-only");
    let line = mount_line(&view).expect("the view is mounted");
    let opts = line.split(' ').nth(5).unwrap();
    for flag in ["nosymfollow", "nosuid", "nodev"] {
        assert!(opts.split(',').any(|o| o == flag), "view lacks {flag}: {line}");
    }
    let real_line = mount_line(&real).expect("the real mount is mounted");
    assert!(!real_line.split(' ').nth(5).unwrap().contains("nosymfollow"), "{real_line}");
    // Both are the same filesystem.
    fs::write(real.join("f"), b"same").unwrap();
    assert_eq!(fs::read(view.join("f")).unwrap(), b"same");
    // Unmounting takes both down.
    h.mounts.unmount(e.scope_id()).unwrap();
    assert!(mount_line(&view).is_none() && mount_line(&real).is_none(), "a mount survived unmount");
}

/// L7: a bind of the mount that survives elsewhere (a container the daemon could not remove, an
/// orchestrator's bind) used to keep the FUSE session alive, so unmount (and scope delete) blocked
/// forever. The connection is now aborted: unmount ends and the survivor can no longer read.
#[test]
fn unmount_ends_when_another_bind_survives() {
    let h = harness();
    let (e, real) = h.scope(big_quota());
    fs::write(real.join("secret"), b"deleted scope data").unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let (src, dst) = (cpath(&real), cpath(elsewhere.path()));
    // SAFETY: valid NUL-terminated paths that outlive the call.
    let rc = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
    assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
    assert_eq!(fs::read(elsewhere.path().join("secret")).unwrap(), b"deleted scope data");

    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = tx.send(h.mounts.unmount(e.scope_id()));
        });
        let done = rx.recv_timeout(Duration::from_secs(60));
        let survivor = fs::read(elsewhere.path().join("secret"));
        // SAFETY: as above; detach the survivor whatever happened, so a failure does not leak it.
        unsafe { libc::umount2(dst.as_ptr(), libc::MNT_DETACH) };
        done.expect("unmount did not finish while a bind survived").expect("unmount");
        assert_eq!(errno_of(survivor, "read through the surviving bind"), libc::ENOTCONN);
    });
}
