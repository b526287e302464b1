//! `scopefs doctor`: host and configuration checks, one `PASS`, `WARN` or `FAIL` line each; non-zero
//! exit if any fails. `WARN`: the daemon runs, but something a user will meet does not work yet (a
//! sandbox image not pulled, a default plan that allows no compute).

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use scopefs::config::Config;

use crate::setup;

/// What one check found, with what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass(String),
    /// Works, but not for everything a user will try (the line says what and how to fix it).
    Warn(String),
    Fail(String),
}

impl From<Result<String, String>> for Outcome {
    fn from(r: Result<String, String>) -> Outcome {
        match r {
            Ok(detail) => Outcome::Pass(detail),
            Err(reason) => Outcome::Fail(reason),
        }
    }
}

/// The outcome of one check.
pub struct Check {
    pub name: &'static str,
    pub outcome: Outcome,
}

impl Check {
    fn of(name: &'static str, outcome: impl Into<Outcome>) -> Check {
        Check { name, outcome: outcome.into() }
    }

    fn line(&self) -> String {
        match &self.outcome {
            Outcome::Pass(detail) => format!("PASS {}: {detail}", self.name),
            Outcome::Warn(detail) => format!("WARN {}: {detail}", self.name),
            Outcome::Fail(reason) => format!("FAIL {}: {reason}", self.name),
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

fn docker_image(cfg: &Config) -> Outcome {
    let image = &cfg.executor.image;
    let Some(socket) = cfg.executor.docker_socket() else {
        return Outcome::Fail("executor.docker_host is not a Unix socket".into());
    };
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
        Ok(200) => Outcome::Pass(format!("sandbox image {image} is present")),
        Ok(404) if !required => Outcome::Warn(format!(
            "sandbox image {image} is not present (isolation optional: compute tools answer 503 until it is; \
             pull or build it, or set executor.image)"
        )),
        Ok(404) => Outcome::Fail(format!(
            "sandbox image {image} is not present (isolation required: serve will refuse to start)"
        )),
        Ok(code) => Outcome::Fail(format!("inspecting sandbox image {image} answered HTTP {code}")),
        Err(e) => Outcome::Fail(format!("cannot inspect sandbox image {image}: {e}")),
    }
}

/// The plan new accounts get (`pricing.default_plan`) and what it allows; a plan without compute
/// is a warning: every new user's `create_environment` answers 429 until an operator acts.
fn default_plan(cfg: &Config) -> Outcome {
    let pricing = &cfg.pricing;
    let name = &pricing.default_plan;
    let Some(plan) = pricing.plan(name) else {
        return Outcome::Fail(format!("pricing.default_plan names no [pricing.plans.{name}]"));
    };
    let mode = match cfg.billing.mode {
        scopefs::config::BillingMode::Settle => "this daemon charges (billing.mode = \"settle\")",
        scopefs::config::BillingMode::Report => "the gateway charges (billing.mode = \"report\")",
    };
    if !plan.compute_allowed {
        return Outcome::Warn(format!(
            "new accounts get plan \"{name}\", which allows no compute: their create_environment answers 429 \
             compute_quota_exceeded until pricing.default_plan names a plan with compute_allowed, or an operator \
             gives them one (PUT /admin/accounts/{{user_id}}/plan); {mode}"
        ));
    }
    Outcome::Pass(format!(
        "new accounts get plan \"{name}\": compute allowed, {} free minutes a month, environments up to {} s, \
         overtime at {} {} a minute; {mode}",
        plan.monthly_minutes, plan.hard_max_runtime_seconds, pricing.overtime_price_per_minute, pricing.currency
    ))
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
        Check::of("fuse-device", dev_fuse()),
        Check::of("mount-permission", mount_permission()),
        Check::of("mount-root", mount_root(cfg)),
        Check::of("registry", registry(cfg)),
        Check::of("object-store", object_store(cfg)),
        Check::of("docker-engine", docker_engine(cfg)),
        Check::of("docker-image", docker_image(cfg)),
        Check::of("billing-plan", default_plan(cfg)),
    ]
}

/// Prints one line per check; `true` when none failed (warnings included).
pub fn run(cfg: &Config) -> bool {
    let mut all = true;
    for check in checks(cfg) {
        println!("{}", check.line());
        all &= !matches!(check.outcome, Outcome::Fail(_));
    }
    all
}
