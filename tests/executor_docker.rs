//! The Docker executor against a real engine (acceptance b and c): the container policy checked by
//! inspecting the created container and by behaviour inside it; commands with exit codes,
//! stdout/stderr, timeouts that really kill, and truncation that says so. Needs root, /dev/fuse, a
//! Docker engine and `SCOPEFS_TEST_DOCKER_IMAGE` (set by scripts/test.sh); without them it fails.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use scopefs::config::ExecutorConfig;
use scopefs::engine::{Quota, ScopeEngine, Storage, StorageSettings};
use scopefs::executor::{ContainerSpec, ExecRequest, Executor};
use scopefs::ids::ScopeId;
use scopefs::store::{LocalDirStore, ObjectStore};
use scopefs_daemon::executor::docker::DockerExecutor;
use scopefs_daemon::executor::policy::ContainerPolicy;
use scopefs_fs::{MountManager, MountOptions};
use serde_json::Value;

const MEMORY: u64 = 64 * 1024 * 1024;
const PIDS: u64 = 64;
const NANO_CPUS: u64 = 500_000_000;

fn docker_image() -> String {
    let image = std::env::var("SCOPEFS_TEST_DOCKER_IMAGE").unwrap_or_default();
    assert!(
        !image.is_empty(),
        "SCOPEFS_TEST_DOCKER_IMAGE is not set: run the suite with scripts/test.sh \
         (or `eval \"$(bash scripts/docker.sh)\"` first)"
    );
    let version = Command::new("docker").args(["version", "--format", "{{.Server.Version}}"]).output();
    let version = version.expect("the docker CLI is not installed (run scripts/install-deps.sh)");
    assert!(version.status.success(), "the Docker engine is not answering (run scripts/docker.sh)");
    let inspect = Command::new("docker").args(["image", "inspect", &image]).output().expect("docker image inspect");
    assert!(inspect.status.success(), "docker image {image} does not exist (run scripts/docker.sh)");
    image
}

/// Two mounted scopes and an executor; removes its containers when dropped.
struct Rig {
    exec: DockerExecutor,
    mounts: MountManager,
    a: Arc<ScopeEngine>,
    b: Arc<ScopeEngine>,
    mnt_a: PathBuf,
    created: parking_lot::Mutex<Vec<String>>,
    _storage: Arc<Storage>,
    rt: tokio::runtime::Runtime,
    _tmp: tempfile::TempDir,
}

impl Rig {
    fn new() -> Rig {
        let image = docker_image();
        let tmp = tempfile::tempdir().expect("tempdir");
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let store: Arc<dyn ObjectStore> = Arc::new(LocalDirStore::new(tmp.path().join("objects")).expect("store"));
        let storage = Storage::new(store, StorageSettings::default(), &tmp.path().join("data"), rt.handle().clone())
            .expect("storage");
        let quota = Quota { bytes: 1 << 30, inodes: 100_000 };
        let a = storage.open_scope(&ScopeId::generate(), quota).expect("scope A");
        let b = storage.open_scope(&ScopeId::generate(), quota).expect("scope B");
        let mounts =
            MountManager::new(&tmp.path().join("mnt"), MountOptions { allow_other: true, ..MountOptions::default() })
                .expect("mount manager");
        let mnt_a = mounts.mount(a.clone()).expect("mount A");
        mounts.mount(b.clone()).expect("mount B");
        // The root of a fresh scope belongs to root; let the sandbox user write.
        std::os::unix::fs::chown(&mnt_a, Some(2_000_000_000), Some(2_000_000_000)).expect("chown A's root");
        let cfg = ExecutorConfig {
            image,
            memory_bytes: MEMORY,
            pids_limit: PIDS,
            nano_cpus: NANO_CPUS,
            tmp_bytes: 32 * 1024 * 1024,
            ..ExecutorConfig::default()
        };
        let exec = DockerExecutor::new("/var/run/docker.sock", ContainerPolicy::from_config(&cfg), rt.handle().clone());
        Rig { exec, mounts, a, b, mnt_a, created: Default::default(), _storage: storage, rt, _tmp: tmp }
    }

    fn spec(&self, read_only: bool) -> ContainerSpec {
        let env = format!("env_test{}", uuid::Uuid::now_v7().simple());
        ContainerSpec {
            deployment_id: "executor-test".into(),
            scope_id: self.a.scope_id().to_string(),
            owner_id: format!("owner-{env}"),
            environment_id: env,
            workspace: self.mnt_a.clone(),
            read_only_workspace: read_only,
            views: Vec::new(),
        }
    }

    fn create(&self, read_only: bool) -> (String, ContainerSpec) {
        let spec = self.spec(read_only);
        let id = self.exec.create(&spec).expect("create the container");
        self.created.lock().push(id.clone());
        (id, spec)
    }

    fn sh(&self, id: &str, cmd: &str) -> (String, String, Option<i64>) {
        let req = ExecRequest { command: cmd.into(), timeout: Duration::from_secs(60), max_output_bytes: 1 << 20 };
        let out = self.exec.exec(id, &req).expect("exec");
        assert!(!out.timed_out, "{cmd} timed out");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            out.exit_code,
        )
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for id in self.created.lock().drain(..) {
            let _ = self.exec.remove(&id);
        }
        self.mounts.unmount_all();
        let _ = &self.rt;
    }
}

fn inspect(id: &str) -> Value {
    let out = Command::new("docker").args(["inspect", id]).output().expect("docker inspect");
    assert!(out.status.success(), "docker inspect {id} failed");
    let v: Value = serde_json::from_slice(&out.stdout).expect("inspect JSON");
    v[0].clone()
}

#[test]
fn container_policy_by_inspection() {
    let rig = Rig::new();
    let (id, spec) = rig.create(false);
    let c = inspect(&id);
    let host = &c["HostConfig"];
    let mounts = c["Mounts"].as_array().expect("Mounts");
    assert_eq!(mounts.len(), 1, "exactly one mount: {mounts:?}");
    assert_eq!(mounts[0]["Type"], "bind");
    assert_eq!(mounts[0]["Destination"], "/workspace");
    assert_eq!(mounts[0]["Source"], rig.mnt_a.to_string_lossy().as_ref());
    assert_eq!(mounts[0]["RW"], true);
    assert!(host["Binds"].is_null() || host["Binds"].as_array().is_some_and(|b| b.is_empty()), "no other binds");
    assert!(!c.to_string().contains("docker.sock"), "the Docker socket appears in the container's config");
    assert_eq!(host["NetworkMode"], "none");
    assert_eq!(host["CapDrop"], serde_json::json!(["ALL"]));
    assert!(host["CapAdd"].is_null() || host["CapAdd"].as_array().is_some_and(|a| a.is_empty()));
    assert!(host["SecurityOpt"]
        .as_array()
        .expect("SecurityOpt")
        .iter()
        .any(|o| o.as_str().is_some_and(|s| s.starts_with("no-new-privileges"))));
    assert_eq!(host["ReadonlyRootfs"], true);
    assert!(host["Tmpfs"]["/tmp"].as_str().is_some_and(|o| o.contains("nosuid")), "tmpfs /tmp: {}", host["Tmpfs"]);
    assert_eq!(host["Memory"], MEMORY);
    assert_eq!(host["MemorySwap"], MEMORY, "no swap beyond the memory limit");
    assert_eq!(host["NanoCpus"], NANO_CPUS);
    assert_eq!(host["PidsLimit"], PIDS);
    assert_eq!(host["Privileged"], false);
    assert_eq!(host["PidMode"], "", "host PID namespace");
    assert_eq!(host["IpcMode"], "private");
    assert!(host["Devices"].is_null() || host["Devices"].as_array().is_some_and(|d| d.is_empty()));
    assert_eq!(c["Config"]["User"], "2000000000:2000000000");
    let labels = &c["Config"]["Labels"];
    assert_eq!(labels["io.scopefs.deployment"], "executor-test");
    assert_eq!(labels["io.scopefs.scope"], spec.scope_id.as_str());
    assert_eq!(labels["io.scopefs.owner"], spec.owner_id.as_str());
    assert_eq!(labels["io.scopefs.environment"], spec.environment_id.as_str());
    assert!(!c["Config"]["Env"].to_string().to_lowercase().contains("token"), "no secrets in the environment");

    let (ro, _) = rig.create(true);
    assert_eq!(inspect(&ro)["Mounts"][0]["RW"], false, "memory-worker variant is read-only");
    let (_, err, code) = rig.sh(&ro, "touch /workspace/x");
    assert_ne!(code, Some(0), "wrote to a read-only /workspace: {err}");

    // Listing by label finds them; removal is idempotent.
    let listed = rig.exec.list("executor-test").expect("list");
    assert!(listed.iter().any(|l| l.container_id == id && l.running));
    rig.exec.remove(&ro).expect("remove");
    rig.exec.remove(&ro).expect("remove twice");
    assert!(!rig.exec.list("executor-test").expect("list").iter().any(|l| l.container_id == ro));
}

#[test]
fn container_policy_by_behaviour() {
    let rig = Rig::new();
    std::fs::write(rig.mnt_a.join("mine.txt"), b"A").expect("A's file");
    let (id, _) = rig.create(false);
    let b_id = rig.b.scope_id().to_string();
    let mount_root = rig.mounts.mount_root().to_string_lossy().into_owned();

    let (out, _, _) = rig.sh(&id, "ls /sys/class/net");
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), vec!["lo"], "network interfaces");
    let (out, _, _) = rig.sh(&id, "cat /proc/net/route | wc -l");
    assert_eq!(out.trim(), "1", "routes (header only expected)");
    let (_, _, code) = rig.sh(&id, "wget -q -T 3 -O /dev/null http://1.1.1.1/");
    assert_ne!(code, Some(0), "network reachable");

    let (mountinfo, _, _) = rig.sh(&id, "cat /proc/self/mountinfo");
    assert!(!mountinfo.contains(&b_id), "mountinfo shows scope B:\n{mountinfo}");
    assert!(!mountinfo.contains(&mount_root), "mountinfo shows the mount root:\n{mountinfo}");
    assert!(mountinfo.contains(&format!("scopefs:{}", rig.a.scope_id())), "A's mount missing:\n{mountinfo}");
    let (out, _, _) = rig.sh(&id, "ls /workspace");
    assert_eq!(out.trim(), "mine.txt");

    for cmd in ["mknod /tmp/null c 1 3", "mknod /workspace/null c 1 3", "mknod /tmp/blk b 8 0"] {
        let (_, _, code) = rig.sh(&id, cmd);
        assert_ne!(code, Some(0), "{cmd} succeeded");
    }
    for cmd in ["touch /x", "touch /etc/passwd", "mkdir /usr/new"] {
        let (_, _, code) = rig.sh(&id, cmd);
        assert_ne!(code, Some(0), "{cmd} succeeded on the read-only root");
    }
    let (_, _, code) = rig.sh(&id, "echo ok > /tmp/ok && cat /tmp/ok && echo hi > /workspace/from-sandbox");
    assert_eq!(code, Some(0), "/tmp and /workspace are writable");
    assert_eq!(std::fs::read(rig.mnt_a.join("from-sandbox")).expect("file via the mount"), b"hi\n");
    let (out, _, _) = rig.sh(&id, "id -u; id -g");
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), vec!["2000000000", "2000000000"]);
    let (out, _, _) = rig.sh(&id, "grep CapEff /proc/self/status");
    assert!(out.trim().ends_with("0000000000000000"), "effective capabilities: {out}");
    let (out, _, _) = rig.sh(&id, "find / -name docker.sock 2>/dev/null; ls /var/run/docker.sock 2>&1; true");
    assert!(!out.lines().any(|l| l.ends_with("docker.sock") && !l.contains("No such")), "docker socket inside: {out}");

    // Memory: a 200 MiB buffer is killed under the 64 MiB limit, an 8 MiB one is fine.
    let (_, _, code) = rig.sh(&id, "dd if=/dev/zero of=/dev/null bs=8M count=1 2>/dev/null");
    assert_eq!(code, Some(0), "8 MiB allocation");
    let (_, _, code) = rig.sh(&id, "dd if=/dev/zero of=/dev/null bs=200M count=1 2>/dev/null");
    assert_ne!(code, Some(0), "a 200 MiB allocation survived the 64 MiB limit");

    // Pids: a fork loop stops at the limit (counted from the host).
    let (bomb, _) = rig.create(false);
    let req = ExecRequest {
        command: "(n=0; while [ $n -lt 500 ]; do sleep 120 & n=$((n+1)); done) 2>/dev/null".into(),
        timeout: Duration::from_secs(20),
        max_output_bytes: 4096,
    };
    let _ = rig.exec.exec(&bomb, &req);
    let top = Command::new("docker").args(["top", &bomb]).output().expect("docker top");
    let procs = String::from_utf8_lossy(&top.stdout).lines().skip(1).count() as u64;
    assert!(procs >= 10, "the fork loop did not run ({procs} processes)");
    assert!(procs <= PIDS, "{procs} processes in a container limited to {PIDS}");
}

#[test]
fn commands_exit_codes_output_timeout_truncation() {
    let rig = Rig::new();
    let (id, _) = rig.create(false);
    let (out, err, code) = rig.sh(&id, "echo out; echo err >&2; exit 3");
    assert_eq!((out.as_str(), err.as_str(), code), ("out\n", "err\n", Some(3)));
    let (_, _, code) = rig.sh(&id, "true");
    assert_eq!(code, Some(0));
    let (_, err, code) = rig.sh(&id, "no-such-command-xyz");
    assert_eq!(code, Some(127), "{err}");
    let (out, _, _) = rig.sh(&id, "pwd");
    assert_eq!(out.trim(), "/workspace");

    // Timeout: the command and its background child are killed, not left running.
    let started = Instant::now();
    let req = ExecRequest {
        command: "sleep 300 & sleep 301; echo never".into(),
        timeout: Duration::from_secs(2),
        max_output_bytes: 4096,
    };
    let out = rig.exec.exec(&id, &req).expect("exec with timeout");
    assert!(out.timed_out, "timed_out not reported");
    assert!(started.elapsed() < Duration::from_secs(15), "timeout took {:?}", started.elapsed());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("never"));
    assert_ne!(out.exit_code, Some(0));
    // The kill reaches both sleeps (polled: the container reaps them asynchronously).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (ps, _, _) = rig.sh(&id, "ps -o args");
        if !ps.contains("sleep 30") {
            break;
        }
        assert!(Instant::now() < deadline, "the timed-out command still runs:\n{ps}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Truncation says so; output at the limit is not truncated.
    let req =
        |cmd: &str, max| ExecRequest { command: cmd.into(), timeout: Duration::from_secs(30), max_output_bytes: max };
    let out = rig.exec.exec(&id, &req("yes | head -c 100000; yes e | head -c 5000 >&2", 1000)).expect("exec");
    assert!(out.truncated);
    assert_eq!(out.stdout.len() + out.stderr.len(), 1000);
    assert_eq!(out.exit_code, Some(0));
    let out = rig.exec.exec(&id, &req("printf 0123456789", 10)).expect("exec");
    assert!(!out.truncated);
    assert_eq!(out.stdout, b"0123456789");
}
