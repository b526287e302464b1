//! `scopefs doctor`: host and configuration checks, one `PASS`/`FAIL` line each; non-zero exit if any fails.

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use scopefs::config::Config;
use scopefs::registry::Registry;

use crate::setup;

/// The outcome of one check.
pub struct Check {
    pub name: &'static str,
    pub result: Result<String, String>,
}

impl Check {
    fn line(&self) -> String {
        match &self.result {
            Ok(detail) => format!("PASS {}: {detail}", self.name),
            Err(reason) => format!("FAIL {}: {reason}", self.name),
        }
    }
}

fn dev_fuse() -> Result<String, String> {
    let path = Path::new("/dev/fuse");
    if !path.exists() {
        return Err("/dev/fuse does not exist (load the fuse module or pass the device to the container)".into());
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(|_| "/dev/fuse opens read-write".to_string())
        .map_err(|e| format!("/dev/fuse cannot be opened: {e}"))
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

fn mount_permission() -> Result<String, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        Ok("running as root".into())
    } else if on_path("fusermount3") {
        Ok("not root, fusermount3 is available".into())
    } else {
        Err("not root and fusermount3 is not on PATH (install fuse3 or run as root)".into())
    }
}

fn mount_root(cfg: &Config) -> Result<String, String> {
    let root = &cfg.mount_root;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
        .map_err(|e| format!("mount_root cannot be created: {e}"))?;
    if !root.is_dir() {
        return Err("mount_root exists but is not a directory".into());
    }
    Ok("mount_root exists and is a directory".into())
}

fn registry(cfg: &Config) -> Result<String, String> {
    setup::control_dir(cfg).map_err(|e| format!("control directory cannot be created: {e}"))?;
    let reg = Registry::open(&setup::registry_path(cfg)).map_err(|e| e.to_string())?;
    Ok(format!("opens, migrations applied (schema version {})", reg.schema_version()))
}

fn object_store(cfg: &Config) -> Result<String, String> {
    let rt = setup::runtime().map_err(|e| e.to_string())?;
    let store = {
        let _in_runtime = rt.enter();
        setup::build_store(cfg).map_err(|e| format!("cannot configure the store: {e}"))?
    };
    let described = store.describe();
    rt.block_on(setup::probe_store(store.as_ref(), setup::probe_bound(cfg)))
        .map(|()| format!("put/get/delete probe passed on {described}"))
        .map_err(|e| format!("put/get/delete probe failed on {described}: {e}"))
}

/// Runs every check.
pub fn checks(cfg: &Config) -> Vec<Check> {
    vec![
        Check { name: "fuse-device", result: dev_fuse() },
        Check { name: "mount-permission", result: mount_permission() },
        Check { name: "mount-root", result: mount_root(cfg) },
        Check { name: "registry", result: registry(cfg) },
        Check { name: "object-store", result: object_store(cfg) },
    ]
}

/// Prints one line per check; `true` when all passed.
pub fn run(cfg: &Config) -> bool {
    let mut all = true;
    for check in checks(cfg) {
        println!("{}", check.line());
        all &= check.result.is_ok();
    }
    all
}
