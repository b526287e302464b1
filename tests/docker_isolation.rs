//! Docker isolation: a container that bind-mounts scope A's mountpoint at
//! `/workspace` reads and writes A's files and sees nothing of scope B or of
//! the mount root (acceptance b). Needs root, /dev/fuse, a Docker engine and
//! `SCOPEFS_TEST_DOCKER_IMAGE` (set by scripts/test.sh); without them it fails.

pub mod isolation_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use isolation_support::{assert_no_escape, escape_probes, section, Hidden};
use scopefs::engine::{Quota, ScopeEngine, Storage, StorageSettings};
use scopefs::ids::ScopeId;
use scopefs::store::{LocalDirStore, ObjectStore};
use scopefs_fs::{MountManager, MountOptions};
use sha2::{Digest, Sha256};

/// Two scopes mounted in-process under a private mount root.
struct TwoScopes {
    mounts: MountManager,
    a: Arc<ScopeEngine>,
    b: Arc<ScopeEngine>,
    mnt_a: PathBuf,
    mnt_b: PathBuf,
    _storage: Arc<Storage>,
    _rt: tokio::runtime::Runtime,
    tmp: tempfile::TempDir,
}

impl TwoScopes {
    fn new() -> TwoScopes {
        let tmp = tempfile::tempdir().expect("tempdir");
        let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
        let store: Arc<dyn ObjectStore> =
            Arc::new(LocalDirStore::new(tmp.path().join("objects")).expect("local object store"));
        let storage = Storage::new(store, StorageSettings::default(), &tmp.path().join("data"), rt.handle().clone())
            .expect("storage");
        let quota = Quota { bytes: 1 << 30, inodes: 100_000 };
        let a = storage.open_scope(&ScopeId::generate(), quota).expect("open scope A");
        let b = storage.open_scope(&ScopeId::generate(), quota).expect("open scope B");
        let opts = MountOptions { allow_other: true, ..MountOptions::default() };
        let mounts = MountManager::new(&tmp.path().join("mnt"), opts).expect("mount manager");
        let mnt_a = mounts.mount(a.clone()).expect("mount scope A");
        let mnt_b = mounts.mount(b.clone()).expect("mount scope B");
        TwoScopes { mounts, a, b, mnt_a, mnt_b, _storage: storage, _rt: rt, tmp }
    }
}

impl Drop for TwoScopes {
    fn drop(&mut self) {
        self.mounts.unmount_all();
    }
}

/// The image to run, or a failing test with a clear message.
fn docker_image() -> String {
    let image = std::env::var("SCOPEFS_TEST_DOCKER_IMAGE").unwrap_or_default();
    assert!(
        !image.is_empty(),
        "SCOPEFS_TEST_DOCKER_IMAGE is not set: run the suite with scripts/test.sh \
         (or `eval \"$(bash scripts/docker.sh)\"` first)"
    );
    let version = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .expect("the docker CLI is not installed (run scripts/install-deps.sh)");
    assert!(
        version.status.success(),
        "the Docker engine is not answering (run scripts/docker.sh): {}",
        String::from_utf8_lossy(&version.stderr)
    );
    let inspect = Command::new("docker").args(["image", "inspect", &image]).output().expect("docker image inspect");
    assert!(inspect.status.success(), "docker image {image} does not exist (run scripts/docker.sh)");
    image
}

/// Runs `script` in a locked-down container with `mnt` bound at /workspace.
fn run_in_container(image: &str, mnt: &Path, envs: &[(&str, &str)], script: &str) -> (bool, String, String) {
    let mut cmd = Command::new("docker");
    cmd.args(["run", "--rm", "--network", "none", "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "-v"]);
    cmd.arg(format!("{}:/workspace", mnt.display()));
    for (k, v) in envs {
        cmd.arg("-e").arg(format!("{k}={v}"));
    }
    cmd.args([image, "sh", "-c", script]);
    let out = cmd.output().expect("docker run");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// What the container does on A's files; the escape probes of `isolation_support` follow.
const ON_A: &str = r#"
set -e
echo "==READ=="
cat /workspace/from-host.txt; echo
echo "==READHASH=="
sha256sum /workspace/from-host.txt | cut -d' ' -f1
printf '%s' "$PAYLOAD" > /workspace/from-container.txt
dd if=/dev/urandom of=/workspace/random.bin bs=65536 count=24 2>/dev/null
sync
echo "==WRITEHASH=="
sha256sum /workspace/random.bin | cut -d' ' -f1
echo "==WORKSPACE=="
ls -a /workspace
"#;

/// [`ON_A`], the escape probes (looking for B's file and B's mountpoint) and the end marker.
fn script() -> String {
    let probes = escape_probes("\"$BFILE\"", &["/workspace/../$BSCOPE", "/workspace/../../$BSCOPE"]);
    format!("{ON_A}{probes}echo \"==END==\"\n")
}

#[test]
fn container_sees_only_its_own_scope() {
    let image = docker_image();
    let s = TwoScopes::new();
    let a_id = s.a.scope_id().to_string();
    let b_id = s.b.scope_id().to_string();
    let nonce = format!("{:016x}", rand_u64());

    let host_text = format!("hello from the host, scope A {nonce}");
    std::fs::write(s.mnt_a.join("from-host.txt"), &host_text).expect("write A's file on the host");
    let b_file = format!("secret-of-b-{nonce}.txt");
    let b_bytes = format!("B's private bytes {nonce}");
    std::fs::write(s.mnt_b.join(&b_file), &b_bytes).expect("write B's file on the host");

    let payload = format!("written inside the container {nonce}");
    let (ok, stdout, stderr) = run_in_container(
        &image,
        &s.mnt_a,
        &[("PAYLOAD", payload.as_str()), ("BFILE", b_file.as_str()), ("BSCOPE", b_id.as_str())],
        &script(),
    );
    assert!(ok, "container failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("==END=="), "script did not finish:\nstdout:\n{stdout}\nstderr:\n{stderr}");

    // Reads A's file with the right bytes.
    assert_eq!(section(&stdout, "READ"), vec![host_text.as_str()], "read of A's file");
    assert_eq!(
        section(&stdout, "READHASH"),
        vec![sha256_hex(host_text.as_bytes()).as_str()],
        "hash of A's file inside the container"
    );

    // What the container wrote appears on the host through the mount, byte for byte.
    let back = std::fs::read(s.mnt_a.join("from-container.txt")).expect("container's file on the host");
    assert_eq!(back, payload.as_bytes(), "text written in the container");
    let random = std::fs::read(s.mnt_a.join("random.bin")).expect("container's binary file on the host");
    assert_eq!(random.len(), 24 * 65536, "size of the binary file written in the container");
    assert_eq!(
        section(&stdout, "WRITEHASH"),
        vec![sha256_hex(&random).as_str()],
        "bytes of the binary file differ between container and host"
    );

    // /workspace lists A's files only.
    let mut listing = section(&stdout, "WORKSPACE");
    listing.sort_unstable();
    assert_eq!(listing, vec![".", "..", "from-container.txt", "from-host.txt", "random.bin"], "listing of /workspace");

    // Nothing of B, of A's id or of the mount root is visible from inside.
    let mount_root = s.mounts.mount_root().to_string_lossy().into_owned();
    let tmp_root = s.tmp.path().to_string_lossy().into_owned();
    let hidden = Hidden { scope_ids: &[&a_id, &b_id], not_in_mountinfo: &[&b_id, &mount_root, &tmp_root] };
    let mountinfo = assert_no_escape(&stdout, &hidden);
    let workspace_line = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/workspace"))
        .unwrap_or_else(|| panic!("no /workspace mount in the container's mountinfo:\n{mountinfo}"));
    // After the " - " separator: fstype, source, super options.
    let tail: Vec<&str> = workspace_line.split(" - ").nth(1).unwrap_or_default().split(' ').collect();
    assert!(
        tail.first().is_some_and(|t| t.starts_with("fuse")) && tail.get(1) == Some(&format!("scopefs:{a_id}").as_str()),
        "/workspace is not scope A's scopefs mount: {workspace_line}"
    );

    // B is untouched and did not receive A's files.
    assert_eq!(std::fs::read(s.mnt_b.join(&b_file)).expect("B's file"), b_bytes.as_bytes());
    let mut b_names: Vec<String> = std::fs::read_dir(&s.mnt_b)
        .expect("list B")
        .map(|e| e.expect("entry of B").file_name().to_string_lossy().into_owned())
        .collect();
    b_names.sort_unstable();
    assert_eq!(b_names, vec![b_file.clone()], "scope B's contents after the container ran");
}

#[test]
fn container_of_b_does_not_see_a() {
    let image = docker_image();
    let s = TwoScopes::new();
    let nonce = format!("{:016x}", rand_u64());
    let a_file = format!("only-in-a-{nonce}.txt");
    std::fs::write(s.mnt_a.join(&a_file), b"A").expect("write A's file");
    std::fs::write(s.mnt_b.join("b.txt"), b"B").expect("write B's file");

    let script = r#"
        echo "==LIST=="; ls -a /workspace
        echo "==FIND=="; find / -name "$AFILE" 2>/dev/null || true
        echo "==END=="
    "#;
    let (ok, stdout, stderr) = run_in_container(&image, &s.mnt_b, &[("AFILE", a_file.as_str())], script);
    assert!(ok, "container failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let mut listing = section(&stdout, "LIST");
    listing.sort_unstable();
    assert_eq!(listing, vec![".", "..", "b.txt"], "listing of B's /workspace");
    assert_eq!(section(&stdout, "FIND"), Vec::<&str>::new(), "A's file is findable from B's container");
    assert!(stdout.contains("==END=="), "script did not finish:\n{stdout}");
}

/// A per-run nonce so names from different runs never collide.
fn rand_u64() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    (t as u64) ^ (u64::from(std::process::id()) << 32)
}
