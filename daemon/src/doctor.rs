//! `scopefs doctor`: host and configuration checks, one `PASS`/`FAIL` line each; non-zero exit if any fails.

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use scopefs::config::Config;

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

/// Hidden override of the device the fuse check opens (tests of a missing device only).
const FUSE_DEVICE_ENV: &str = "SCOPEFS_DOCTOR_FUSE_DEVICE";

fn dev_fuse() -> Result<String, String> {
    let device = std::env::var_os(FUSE_DEVICE_ENV).filter(|v| !v.is_empty()).unwrap_or_else(|| "/dev/fuse".into());
    let path = Path::new(&device);
    let shown = path.display();
    if !path.exists() {
        return Err(format!("{shown} does not exist (load the fuse module or pass the device to the container)"));
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(|_| format!("{shown} opens read-write"))
        .map_err(|e| format!("{shown} cannot be opened: {e}"))
}

/// One HTTP/1.0 GET to the Docker engine's Unix socket; the status code.
fn docker_get(socket: &str, path: &str) -> std::io::Result<u16> {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(std::time::Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n")?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head)?;
    let line = String::from_utf8_lossy(&head[..n]);
    line.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP answer"))
}

fn docker_engine(cfg: &Config) -> Result<String, String> {
    let socket = cfg.executor.docker_socket().ok_or("executor.docker_host is not a Unix socket")?;
    match docker_get(socket, "/_ping") {
        Ok(200) => Ok(format!("Docker engine answers at {}", cfg.executor.docker_host)),
        Ok(code) => Err(format!("Docker engine at {} answered /_ping with HTTP {code}", cfg.executor.docker_host)),
        Err(e) => Err(format!(
            "Docker engine unreachable at {} ({e}); sandbox environments cannot start (is dockerd running?)",
            cfg.executor.docker_host
        )),
    }
}

fn docker_image(cfg: &Config) -> Result<String, String> {
    let image = &cfg.executor.image;
    let socket = cfg.executor.docker_socket().ok_or("executor.docker_host is not a Unix socket")?;
    let path: String = image
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'/' | b':' | b'@' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let required = cfg.executor.isolation == scopefs::config::Isolation::Required;
    match docker_get(socket, &format!("/images/{path}/json")) {
        Ok(200) => Ok(format!("sandbox image {image} is present")),
        Ok(404) if !required => Ok(format!(
            "sandbox image {image} is not present (isolation optional: compute tools answer 503 until it is)"
        )),
        Ok(404) => {
            Err(format!("sandbox image {image} is not present (isolation required: serve will refuse to start)"))
        }
        Ok(code) => Err(format!("inspecting sandbox image {image} answered HTTP {code}")),
        Err(e) => Err(format!("cannot inspect sandbox image {image}: {e}")),
    }
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
    let reg = setup::open_registry(cfg).map_err(|e| e.to_string())?;
    Ok(format!("{} opens, migrations applied (schema version {})", reg.backend_name(), reg.schema_version()))
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
        Check { name: "docker-engine", result: docker_engine(cfg) },
        Check { name: "docker-image", result: docker_image(cfg) },
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
