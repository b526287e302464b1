//! The process that serves a recording mount. The crash harness runs its FUSE filesystem in a
//! child process (the test binary again, running only `crashsim_recorder_process`): a FUSE server
//! in the process whose files it serves deadlocks when that process unmaps a shared mapping of
//! them (SQLite's `-shm`) while the server needs the same address-space lock to read a request.
//! The child mounts, then answers the test's commands on a Unix socket; it detaches the mount
//! and exits when told to, or when the test's connection closes (the test process died).

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::recorder_fs::RecordingFs;
use super::recorder_state::State;
use super::wire::{self, In, Out};

/// Variables naming the socket, the backing directory and the mountpoint of a child.
pub const SOCKET_ENV: &str = "SCOPEFS_CRASHSIM_SOCKET";
pub const BACKING_ENV: &str = "SCOPEFS_CRASHSIM_BACKING";
pub const MOUNT_ENV: &str = "SCOPEFS_CRASHSIM_MOUNT";
/// The line a child prints once it is mounted and listening.
pub const READY: &str = "crashsim-recorder-ready";

/// Commands (the first byte of a request).
pub const START: u8 = 0;
pub const OPS: u8 = 1;
pub const COUNTS: u8 = 2;
pub const ARM: u8 = 3;
pub const FIRED: u8 = 4;
pub const RECORDING: u8 = 5;
pub const BRIEF: u8 = 6;
pub const UNMOUNT: u8 = 7;

/// Serves a recording mount when this process was started as a recorder child; returns at
/// once otherwise (a plain run of the ignored helper test).
pub fn serve_if_asked() {
    let var = |v: &str| std::env::var_os(v).map(PathBuf::from);
    let (Some(socket), Some(backing), Some(mountpoint)) = (var(SOCKET_ENV), var(BACKING_ENV), var(MOUNT_ENV)) else {
        return;
    };
    let state = Arc::new(Mutex::new(State::new(&backing).expect("open the backing directory")));
    let mut config = fuser::Config::default();
    config.mount_options = vec![fuser::MountOption::FSName("crashsim".into()), fuser::MountOption::NoDev];
    let session = fuser::spawn_mount(RecordingFs(state.clone()), &mountpoint, &config).expect("mount the recorder");
    let session = Arc::new(Mutex::new(Some(session)));
    let listener = UnixListener::bind(&socket).expect("bind the recorder's socket");
    println!("{READY}");
    std::io::stdout().flush().unwrap();
    // The first connection is the test's: when it closes, the test is gone.
    let (main, _) = listener.accept().expect("the test connects");
    let (st, se, mp) = (state.clone(), session.clone(), mountpoint.clone());
    std::thread::spawn(move || {
        serve(main, &st, &se, &mp);
        detach(&mp);
        std::process::exit(0);
    });
    for conn in listener.incoming().flatten() {
        let (st, se, mp) = (state.clone(), session.clone(), mountpoint.clone());
        std::thread::spawn(move || serve(conn, &st, &se, &mp));
    }
}

fn detach(mountpoint: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; umount2 does not keep it.
    unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
}

type Session = Mutex<Option<fuser::BackgroundSession>>;

/// Answers the commands of one connection until it closes.
fn serve(mut conn: UnixStream, state: &Mutex<State>, session: &Session, mountpoint: &Path) {
    while let Ok(mut req) = In::recv(&mut conn) {
        let mut out = Out::default();
        let Ok(cmd) = req.u8() else { return };
        match cmd {
            START => {
                let r = state.lock().start();
                out.bytes(r.err().map(|e| e.to_string()).unwrap_or_default().as_bytes());
            }
            OPS => {
                out.u64(state.lock().ops() as u64);
            }
            COUNTS => {
                let (w, s) = state.lock().counts();
                out.u64(w as u64).u64(s as u64);
            }
            ARM => {
                let Ok((on, errno)) = wire::get_fault(&mut req) else { return };
                state.lock().arm(on, errno);
            }
            FIRED => {
                let fired = state.lock().fired();
                out.u64(fired.len() as u64);
                for f in &fired {
                    wire::put_fired(&mut out, f);
                }
            }
            RECORDING => state.lock().recording().encode(&mut out),
            BRIEF => {
                let brief = match state.try_lock() {
                    Some(st) => st.brief(),
                    None => "the recorder is serving a request (its state is locked)".into(),
                };
                out.bytes(brief.as_bytes());
            }
            UNMOUNT => {
                detach(mountpoint);
                if let Some(s) = session.lock().take() {
                    // Ends once every file on the mount is closed.
                    let _ = s.join();
                }
                let _ = out.send(&mut conn);
                std::process::exit(0);
            }
            _ => return,
        }
        if out.send(&mut conn).is_err() {
            return;
        }
    }
}
