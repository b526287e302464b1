//! Issue 9 item 3: mounts outlive the process that serves them. A writer appends a numbered line
//! through a scope's real mount every 50 ms (and keeps a second file open, writing through the
//! held descriptor) while the worker under `scopefs serve`'s supervisor is restarted gracefully
//! (SIGHUP) and killed (`kill -9`): the writer never sees an error (no `ENOTCONN`, no `EIO`, the
//! held descriptor included), no line of either file is lost (the held one's writes survive the
//! killed worker in the open-file log), and the mount is the same mount throughout (resumed, never
//! remounted). Also (issue 21): mutations the killed worker applied but never answered are
//! answered as they were by the next one, and an unlinked file and an `O_TMPFILE` held open by a
//! program stay readable (and linkable) across both kinds of restart. A worker killed again and
//! again is restarted every time, after growing delays.

pub mod serve_process;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use serve_process::{client, free_port, provision_and_mount, write_config, ServeProcess};

/// The mount id (mountinfo's first field) of the mount at `path`.
fn mount_id(path: &Path) -> Option<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.to_str().unwrap();
    table.lines().find(|l| l.split(' ').nth(4) == Some(p)).and_then(|l| l.split(' ').next().map(str::to_owned))
}

/// Lines of `path` (empty if unreadable).
fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_owned).collect()
}

/// Waits until `path` has more than `n` lines (bounded).
fn wait_lines_beyond(path: &Path, n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = lines(path).len();
        if now > n {
            return now;
        }
        assert!(Instant::now() < deadline, "the writer made no progress past line {n}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts the writer: appends `i` to `log` (a new open each time) and to `held` (one descriptor
/// held open for the whole run) until `stop` exists; every failure goes to `errors`.
fn start_writer(dir: &Path, mount: &Path) -> (Child, PathBuf, PathBuf, PathBuf) {
    let log = mount.join("log");
    let held = mount.join("held");
    let stop = dir.join("stop-writer");
    let errors = dir.join("writer.err");
    let script = r#"exec 3>>"$2"; i=0; while [ ! -e "$3" ]; do echo $i >> "$1" || echo "log $i failed" >&2; echo $i >&3 || echo "held $i failed" >&2; i=$((i+1)); sleep 0.05; done"#;
    let child = Command::new("sh")
        .args(["-c", script, "writer"])
        .arg(&log)
        .arg(&held)
        .arg(&stop)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&errors).unwrap())
        .spawn()
        .unwrap();
    (child, log, held, stop)
}

/// `0..n` in order: nothing lost, nothing doubled.
fn assert_complete(what: &str, got: &[String]) {
    let want: Vec<String> = (0..got.len()).map(|i| i.to_string()).collect();
    assert_eq!(got, want.as_slice(), "{what}: lines lost or repeated");
}

#[test]
fn a_writer_survives_a_graceful_restart_and_a_killed_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(tmp.path(), port, "[store]\nkind = \"local\"\n");
    let http = client();
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve.log", &[]);
    daemon.wait_ready(&http);
    let (_, mount) = provision_and_mount(&http, &daemon, tmp.path());
    let real = PathBuf::from(mount["bind_source"].as_str().unwrap());
    let view = PathBuf::from(mount["mountpoint"].as_str().unwrap());
    let (real_id, view_id) = (mount_id(&real).expect("real mount"), mount_id(&view).expect("view"));

    let supervisor = daemon.supervisor_pid();
    let first = daemon.worker(None);
    let (mut writer, log, held, stop) = start_writer(tmp.path(), &real);
    let seen = wait_lines_beyond(&log, 5);

    // (a) Graceful restart: the old worker exits, a new one resumes the mount.
    // SAFETY: kill(2) on our child's pid.
    assert_eq!(unsafe { libc::kill(supervisor as i32, libc::SIGHUP) }, 0);
    let second = daemon.worker(Some(first));
    daemon.wait_ready(&http);
    let seen = wait_lines_beyond(&log, seen + 5);
    // The held descriptor kept working, and what it wrote before the restart was committed.
    let held_now = lines(&held);
    assert!(held_now.len() >= seen.min(lines(&log).len()) - 1, "held file behind: {}", held_now.len());
    assert_complete("held (graceful restart)", &held_now);

    // (b) kill -9 of the worker: the supervisor starts another, which resumes the mount.
    // SAFETY: kill(2) on a pid this test owns (the supervisor's child).
    assert_eq!(unsafe { libc::kill(second as i32, libc::SIGKILL) }, 0);
    let third = daemon.worker(Some(second));
    daemon.wait_ready(&http);
    wait_lines_beyond(&log, seen + 5);

    std::fs::write(&stop, b"").unwrap();
    let status = writer.wait().unwrap();
    let errors = std::fs::read_to_string(tmp.path().join("writer.err")).unwrap();
    assert!(status.success() && errors.is_empty(), "the writer saw errors: {errors}");
    assert_complete("log", &lines(&log));
    // The held descriptor's writes before the kill were replayed from the open-file log: nothing
    // it was told was written is missing.
    let held_after = lines(&held);
    assert!(held_after.len() >= held_now.len());
    assert_complete("held (through the killed worker)", &held_after);
    assert_eq!(mount_id(&real), Some(real_id), "the real mount was replaced");
    assert_eq!(mount_id(&view), Some(view_id), "the view was replaced");
    let log_text = daemon.log_text();
    assert_eq!(log_text.matches("scope mount resumed").count(), 2, "log:\n{log_text}");
    assert!(third != first);

    // A real stop still unmounts everything.
    let status = daemon.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit status {status}; log:\n{}", daemon.log_text());
    assert_eq!(mount_id(&real), None, "real mount left after SIGTERM");
    assert_eq!(mount_id(&view), None, "view left after SIGTERM");
}

/// One notification datagram and the descriptors attached to it (none when the wait times out).
fn recv_with_fds(sock: &std::os::unix::net::UnixDatagram) -> Option<(String, Vec<std::os::fd::OwnedFd>)> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let mut data = [0u8; 1024];
    let mut control = [0u8; 256];
    // SAFETY: the msghdr points at live local buffers of the given sizes; each received
    // descriptor is owned exactly once.
    unsafe {
        let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len() as _;
        let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return None;
        }
        let mut fds = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    let fd = libc::CMSG_DATA(cmsg).cast::<i32>().add(i).read_unaligned();
                    fds.push(std::os::fd::OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        Some((String::from_utf8_lossy(&data[..n as usize]).into_owned(), fds))
    }
}

/// Reads notifications until the store holds every name of `want` (as systemd would keep them).
fn collect_store(
    sock: &std::os::unix::net::UnixDatagram,
    store: &mut Vec<(String, std::os::fd::OwnedFd)>,
    want: &[&str],
) {
    while !want.iter().all(|w| store.iter().any(|(n, _)| n == w)) {
        let (text, mut fds) = recv_with_fds(sock).unwrap_or_else(|| panic!("store incomplete: want {want:?}"));
        if let Some(name) = text.strip_prefix("FDSTORE=1\nFDNAME=") {
            assert_eq!(fds.len(), 1, "{text}");
            store.retain(|(n, _)| n != name);
            store.push((name.to_owned(), fds.remove(0)));
        }
    }
}

/// The systemd path, emulated: the daemon is the main process (`NOTIFY_SOCKET` set, a descriptor
/// store announced), hands its mount's connection and HTTP socket over with `FDSTORE=1`, and a
/// daemon started with them (`LISTEN_FDS`) resumes the mount, after `kill -9` and after SIGTERM
/// (which, under systemd, keeps the mounts: `systemctl restart`). The unit's `ExecStop=`
/// (`scopefs service-stop`) leaves it serving for a restart job and stops it for real for a stop
/// job (issue 22 d: no container left on a dead mount once the store is closed).
#[test]
fn under_systemd_the_fd_store_keeps_the_mount_across_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(tmp.path(), port, "[store]\nkind = \"local\"\n");
    let http = client();
    let notify_path = tmp.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let env = [("NOTIFY_SOCKET", notify_path.to_str().unwrap()), ("SCOPEFS_FDSTORE", "16")];
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve-1.log", &env);
    daemon.wait_ready(&http);
    let (scope, mount) = provision_and_mount(&http, &daemon, tmp.path());
    let real = PathBuf::from(mount["bind_source"].as_str().unwrap());
    let real_id = mount_id(&real).expect("real mount");
    let fuse_name = format!("fuse-{scope}");
    let mut store = Vec::new();
    collect_store(&notify, &mut store, &["http", &fuse_name]);

    let (mut writer, log, _held, stop) = start_writer(tmp.path(), &real);
    let seen = wait_lines_beyond(&log, 5);
    // kill -9 of the main process: systemd keeps the store and starts the service again.
    daemon.kill9();
    assert_eq!(mount_id(&real), Some(real_id.clone()), "the mount must outlive the process");
    let mut daemon = ServeProcess::start_with_fds(tmp.path(), &config, port, "serve-2.log", &env, &store);
    daemon.wait_ready(&http);
    let seen = wait_lines_beyond(&log, seen + 5);
    // SIGTERM (systemctl restart): the process exits 0 and the mount stays.
    let status = daemon.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit status {status}; log:\n{}", daemon.log_text());
    assert_eq!(mount_id(&real), Some(real_id.clone()), "SIGTERM under systemd must keep the mount");
    let mut daemon = ServeProcess::start_with_fds(tmp.path(), &config, port, "serve-3.log", &env, &store);
    daemon.wait_ready(&http);
    wait_lines_beyond(&log, seen + 5);
    assert!(daemon.log_text().contains("scope mount resumed"), "log:\n{}", daemon.log_text());

    std::fs::write(&stop, b"").unwrap();
    let status = writer.wait().unwrap();
    let errors = std::fs::read_to_string(tmp.path().join("writer.err")).unwrap();
    assert!(status.success() && errors.is_empty(), "the writer saw errors: {errors}");
    assert_complete("log", &lines(&log));
    assert_eq!(mount_id(&real), Some(real_id.clone()), "the real mount was replaced");

    // The unit's ExecStop= before systemd's SIGTERM: a restart job leaves the daemon serving.
    let pid = daemon.supervisor_pid();
    let hook = service_stop(tmp.path(), pid, "restart");
    assert!(hook.status.success(), "{hook:?}");
    assert_eq!(mount_id(&real), Some(real_id), "ExecStop of a restart must keep the mount");
    assert!(http.get(format!("{}/ready", daemon.base)).send().is_ok_and(|r| r.status().is_success()));
    // A stop job: the daemon gets SIGINT, stops for real (unmounts), and has exited when the
    // hook returns, before systemd would close the store and send SIGTERM.
    let hook = service_stop(tmp.path(), pid, "stop");
    assert!(hook.status.success(), "{hook:?}");
    let status = daemon.wait_exit(Duration::ZERO);
    assert!(status.success(), "exit status {status}; log:\n{}", daemon.log_text());
    assert_eq!(mount_id(&real), None, "a stop must unmount the scope");
    drop(store);
}

/// Runs `scopefs service-stop --unit scopefs.service` as systemd runs the unit's `ExecStop=`: with
/// `$MAINPID`, and a `systemctl` on `PATH` whose `list-jobs` shows one job of type `job` on the unit.
fn service_stop(dir: &Path, main_pid: u32, job: &str) -> std::process::Output {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join(format!("systemctl-{job}"));
    std::fs::create_dir_all(&bin).unwrap();
    let script = format!("#!/bin/sh\n[ \"$1\" = list-jobs ] || exit 3\necho '  80 scopefs.service {job} running'\n");
    std::fs::write(bin.join("systemctl"), script).unwrap();
    std::fs::set_permissions(bin.join("systemctl"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    Command::new(serve_process::BIN)
        .args(["service-stop", "--unit", "scopefs.service"])
        .env("MAINPID", main_pid.to_string())
        .env("PATH", path)
        .output()
        .unwrap()
}

/// A request the killed worker had read but not answered (here a lookup the test hook stalls) is
/// resent to the next worker (`FUSE_NOTIFY_RESEND`) and answered: its caller neither hangs nor
/// sees `ENOTCONN`.
#[test]
fn a_request_in_flight_at_kill_9_is_answered_by_the_next_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(tmp.path(), port, "[store]\nkind = \"local\"\n");
    let http = client();
    let marker = tmp.path().join("stall-marker");
    let env = [("SCOPEFS_TEST_FUSE_STALL", marker.to_str().unwrap())];
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve.log", &env);
    daemon.wait_ready(&http);
    let (_, mount) = provision_and_mount(&http, &daemon, tmp.path());
    let real = PathBuf::from(mount["bind_source"].as_str().unwrap());

    std::fs::write(&marker, b"").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let target = real.join("stall-me");
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::symlink_metadata(&target).map(drop).map_err(|e| e.raw_os_error()));
    });
    let reached = tmp.path().join("stall-marker.reached");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reached.exists() {
        assert!(Instant::now() < deadline, "the lookup never reached the worker");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(rx.try_recv().is_err(), "the stalled lookup was answered before the kill");
    let worker = daemon.pid();
    // SAFETY: kill(2) on the supervisor's child, which this test started.
    assert_eq!(unsafe { libc::kill(worker as i32, libc::SIGKILL) }, 0);
    daemon.worker(Some(worker));
    let answer = rx.recv_timeout(Duration::from_secs(60)).expect("the request in flight was never answered");
    assert_eq!(answer, Err(Some(libc::ENOENT)), "answered by the next worker: no such file");
    daemon.wait_ready(&http);
}

/// Waits (bounded) until the stall hook's marker was reached.
fn wait_reached(marker: &Path) {
    let mut reached = marker.as_os_str().to_owned();
    reached.push(".reached");
    let reached = PathBuf::from(reached);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reached.exists() {
        assert!(Instant::now() < deadline, "the request never reached the worker");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_file(&reached).unwrap();
}

/// `renameat2(from, to, RENAME_EXCHANGE)`.
fn exchange(from: &Path, to: &Path) -> Result<(), i32> {
    use std::os::unix::ffi::OsStrExt;
    let (a, b) = (
        std::ffi::CString::new(from.as_os_str().as_bytes()).unwrap(),
        std::ffi::CString::new(to.as_os_str().as_bytes()).unwrap(),
    );
    // SAFETY: two NUL-terminated paths that outlive the call.
    let rc = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// D5: a mutation the killed worker applied and never answered (the hook stalls it after the engine
/// ran it) is resent by the kernel to the next worker, which answers it as it was: `mkdir` and an
/// exclusive create succeed (not `EEXIST`), an exchange of two names happens once.
#[test]
fn mutations_applied_but_unanswered_at_kill_9_are_answered_as_they_were() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(tmp.path(), port, "[store]\nkind = \"local\"\n");
    let http = client();
    let marker = tmp.path().join("stall-marker");
    let env = [("SCOPEFS_TEST_FUSE_STALL", marker.to_str().unwrap())];
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve.log", &env);
    daemon.wait_ready(&http);
    let (_, mount) = provision_and_mount(&http, &daemon, tmp.path());
    let real = PathBuf::from(mount["bind_source"].as_str().unwrap());
    let target = real.join("stall-after-me");
    std::fs::write(real.join("x"), b"X").unwrap();
    type Op = Box<dyn FnOnce() -> Result<(), i32> + Send>;
    let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(0);
    let cases: Vec<(&str, Op)> = vec![
        (
            "mkdir",
            Box::new({
                let t = target.clone();
                move || std::fs::create_dir(&t).map_err(errno)
            }),
        ),
        (
            "exclusive create",
            Box::new({
                let t = target.clone();
                move || {
                    use std::io::Write;
                    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&t).map_err(errno)?;
                    f.write_all(b"created once").map_err(errno)
                }
            }),
        ),
        (
            "exchange",
            Box::new({
                let (x, t) = (real.join("x"), target.clone());
                move || exchange(&x, &t)
            }),
        ),
    ];
    for (what, op) in cases {
        if what == "exchange" {
            std::fs::write(&target, b"S").unwrap();
        }
        std::fs::write(&marker, b"").unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(op());
        });
        wait_reached(&marker);
        assert!(rx.try_recv().is_err(), "{what}: answered before the kill");
        let worker = daemon.pid();
        // SAFETY: kill(2) on the supervisor's child, which this test started.
        assert_eq!(unsafe { libc::kill(worker as i32, libc::SIGKILL) }, 0);
        daemon.worker(Some(worker));
        let answer = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("{what}: never answered"));
        assert_eq!(answer, Ok(()), "{what}: answered as the first run was");
        daemon.wait_ready(&http);
        match what {
            "mkdir" => {
                assert!(target.is_dir());
                std::fs::remove_dir(&target).unwrap();
            }
            "exclusive create" => {
                assert_eq!(std::fs::read(&target).unwrap(), b"created once");
                std::fs::remove_file(&target).unwrap();
            }
            _ => {
                assert_eq!(std::fs::read(real.join("x")).unwrap(), b"S", "exchanged once, not back");
                assert_eq!(std::fs::read(&target).unwrap(), b"X");
            }
        }
    }
    daemon.stop(Duration::from_secs(60));
}

/// D3: a program holding an unlinked file and an `O_TMPFILE` file open reads both after a graceful
/// restart and after kill -9 of the worker, writes more through them, and links the tmpfile.
#[test]
fn an_unlinked_file_and_an_o_tmpfile_held_open_outlive_both_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(tmp.path(), port, "[store]\nkind = \"local\"\n");
    let http = client();
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve.log", &[]);
    daemon.wait_ready(&http);
    let (_, mount) = provision_and_mount(&http, &daemon, tmp.path());
    let real = PathBuf::from(mount["bind_source"].as_str().unwrap());
    let program = r#"
import ctypes, os, sys
d = sys.argv[1]
f = open(os.path.join(d, "unlinked"), "w+b", buffering=0)
f.write(b"unlinked:0;")
os.unlink(os.path.join(d, "unlinked"))
t = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o600)
os.write(t, b"tmpfile:0;")
print("ready", flush=True)
n = 0
for line in sys.stdin:
    cmd = line.strip()
    f.seek(0)
    os.lseek(t, 0, os.SEEK_SET)
    want_f = b"".join(b"unlinked:%d;" % i for i in range(n + 1))
    want_t = b"".join(b"tmpfile:%d;" % i for i in range(n + 1))
    got_f, got_t = f.read(), os.read(t, 4096)
    if got_f != want_f or got_t != want_t:
        print("mismatch", len(got_f), len(got_t), flush=True)
        continue
    if cmd == "link":
        # linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH): what O_TMPFILE users do.
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.linkat(t, b"", -100, os.path.join(d, "linked").encode(), 0x1000) != 0:
            raise OSError(ctypes.get_errno(), "linkat")
        print("linked", flush=True)
        continue
    n += 1
    f.write(b"unlinked:%d;" % n)
    os.write(t, b"tmpfile:%d;" % n)
    print("ok", flush=True)
"#;
    let mut child = Command::new("python3")
        .args(["-c", program])
        .arg(&real)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut ask = |cmd: &str| -> String {
        use std::io::{BufRead, Write};
        if !cmd.is_empty() {
            writeln!(stdin, "{cmd}").unwrap();
            stdin.flush().unwrap();
        }
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    };
    assert_eq!(ask(""), "ready");
    assert_eq!(ask("check"), "ok", "before any restart");
    let supervisor = daemon.supervisor_pid();
    let first = daemon.worker(None);
    // SAFETY: kill(2) on our child's pid.
    assert_eq!(unsafe { libc::kill(supervisor as i32, libc::SIGHUP) }, 0);
    let second = daemon.worker(Some(first));
    daemon.wait_ready(&http);
    assert_eq!(ask("check"), "ok", "after a graceful restart");
    // SAFETY: kill(2) on the supervisor's child.
    assert_eq!(unsafe { libc::kill(second as i32, libc::SIGKILL) }, 0);
    daemon.worker(Some(second));
    daemon.wait_ready(&http);
    assert_eq!(ask("check"), "ok", "after kill -9 of the worker");
    assert_eq!(ask("link"), "linked");
    assert_eq!(std::fs::read(real.join("linked")).unwrap(), b"tmpfile:0;tmpfile:1;tmpfile:2;tmpfile:3;");
    drop(stdin);
    assert!(child.wait().unwrap().success());
    daemon.stop(Duration::from_secs(60));
}

/// A worker that keeps dying soon after each start is restarted every time (the supervisor never
/// gives up while it holds kept mounts: giving up would end them all with `ENOTCONN`), after a
/// delay that doubles from 250 ms, each restart logged with its delay; the mount then works.
#[test]
fn a_worker_killed_eight_times_in_quick_succession_is_restarted_every_time() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(tmp.path(), port, "[store]\nkind = \"local\"\n");
    let http = client();
    let env = [("SCOPEFS_LOG_FORMAT", "json")];
    let mut daemon = ServeProcess::start(tmp.path(), &config, port, "serve.log", &env);
    daemon.wait_ready(&http);
    let (_, mount) = provision_and_mount(&http, &daemon, tmp.path());
    let real = PathBuf::from(mount["bind_source"].as_str().unwrap());
    let real_id = mount_id(&real).expect("real mount");
    std::fs::write(real.join("before"), b"written before the crashes").unwrap();

    let mut worker = daemon.worker(None);
    for _ in 0..8 {
        // SAFETY: kill(2) on the supervisor's child, which this test started.
        assert_eq!(unsafe { libc::kill(worker as i32, libc::SIGKILL) }, 0);
        worker = daemon.worker(Some(worker));
        daemon.wait_ready(&http);
    }
    std::fs::write(real.join("after"), b"written after eight crashes").unwrap();
    assert_eq!(std::fs::read(real.join("after")).unwrap(), b"written after eight crashes");
    assert_eq!(std::fs::read(real.join("before")).unwrap(), b"written before the crashes");
    assert_eq!(mount_id(&real), Some(real_id), "the mount was replaced");
    let log = daemon.log_text();
    let delays: Vec<u64> = log
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|v| v["fields"]["message"] == "worker died; restarting it with the kept mounts")
        .map(|v| v["fields"]["delay_ms"].as_u64().expect("a restart logged without its delay"))
        .collect();
    // Each worker dies well within 10 s of its readiness (the first, which also provisioned, may
    // not have on a slow machine: restarted at once), so the delays double up to 30 s.
    let doubling = [250, 500, 1000, 2000, 4000, 8000, 16_000, 30_000];
    let want: Vec<u64> = if delays.first() == Some(&0) {
        std::iter::once(0).chain(doubling[..7].iter().copied()).collect()
    } else {
        doubling.to_vec()
    };
    assert_eq!(delays, want, "log:\n{log}");
    let status = daemon.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit status {status}; log:\n{}", daemon.log_text());
}
