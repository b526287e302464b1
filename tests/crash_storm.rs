//! Acceptance e: `kill -9` of the daemon at random points of a write storm, ten rounds; every file whose
//! close() (or fsync) returned keeps its exact content, the journal is replayed, and the metadata is sound.

pub mod serve_process;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngExt;
use serve_process::{free_port, write_config, ServeProcess};
use sha2::{Digest, Sha256};

const TOKEN: &str = "crash-storm-service-token";

/// The daemon's config: small blocks and one upload at a time, so that a kill finds uploads queued.
fn config(dir: &Path, port: u16) -> PathBuf {
    let rest = format!(
        "service_token = {TOKEN:?}\nadmin_token = \"crash-storm-admin-token\"\nblock_size = 65536\n\
         upload_parallelism = 1\n\n[store]\nkind = \"local\"\npath = {objects:?}\n",
        objects = dir.join("objects"),
    );
    write_config(dir, port, &rest)
}

/// A ready daemon, its log in `<dir>/serve-<round>.log`.
fn start(dir: &Path, config: &Path, port: u16, round: usize) -> ServeProcess {
    let mut d = ServeProcess::start(dir, config, port, &format!("serve-{round}.log"), &[("SCOPEFS_LOG", "warn")]);
    d.wait_ready(&reqwest::blocking::Client::new());
    d
}

fn provision(d: &ServeProcess) -> String {
    let r = reqwest::blocking::Client::new()
        .post(format!("{}/internal/workspace-scopes/provision", d.base))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"operation_id": "crash-storm-op", "primary_thread_id": "crash-storm-thread"}))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "provision: {}", r.status());
    let v: serde_json::Value = r.json().unwrap();
    v["scope_id"].as_str().expect("scope_id in provision answer").to_string()
}

fn sha(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Files whose close (or fsync) returned, with the SHA-256 of the content they must have.
type Manifest = Arc<Mutex<BTreeMap<String, String>>>;

/// Writes (and overwrites) files until `stop` or the daemon dies; counts each closed file in `closed`.
fn storm(mnt: PathBuf, round: usize, manifest: Manifest, stop: Arc<AtomicBool>, closed: Arc<AtomicUsize>) {
    let mut rng = rand::rng();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let existing: Vec<String> = manifest.lock().unwrap().keys().cloned().collect();
        let overwrite = !existing.is_empty() && rng.random_bool(0.3);
        let name =
            if overwrite { existing[rng.random_range(0..existing.len())].clone() } else { format!("r{round}-f{i}") };
        let len = rng.random_range(0..300_000usize);
        let mut data = vec![0u8; len];
        rng.fill(&mut data[..]);
        // From the open with O_TRUNC on, the old content is gone whatever happens next.
        manifest.lock().unwrap().remove(&name);
        let path = mnt.join(&name);
        let fsync = rng.random_bool(0.5);
        let result = (|| -> std::io::Result<()> {
            let mut f = std::fs::File::create(&path)?;
            f.write_all(&data)?;
            if fsync {
                f.sync_all()?;
            }
            drop(f); // close(): FUSE flush, whose error std ignores, so re-check with a read
            Ok(())
        })();
        if result.is_err() {
            return; // the daemon is gone
        }
        // std's drop swallows close() errors; a successful fsync or a readable file proves the commit.
        match std::fs::read(&path) {
            Ok(back) if back == data => {
                manifest.lock().unwrap().insert(name, sha(&data));
                closed.fetch_add(1, Ordering::SeqCst);
            }
            _ => return,
        }
    }
}

#[test]
fn kill_minus_nine_during_a_write_storm_loses_nothing_that_was_closed() {
    let rounds: usize = std::env::var("SCOPEFS_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = config(dir.path(), port);
    let manifest: Manifest = Arc::new(Mutex::new(BTreeMap::new()));
    let mut scope = None;
    let mut rng = rand::rng();
    for round in 0..rounds {
        let mut d = start(dir.path(), &config, port, round);
        let scope_id = scope.get_or_insert_with(|| provision(&d)).clone();
        let mnt = d.mount_root.join(&scope_id);
        verify(&mnt, &manifest, round);
        let stop = Arc::new(AtomicBool::new(false));
        let closed = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (mnt, manifest, stop, closed) = (mnt.clone(), manifest.clone(), stop.clone(), closed.clone());
            std::thread::spawn(move || storm(mnt, round, manifest, stop, closed))
        };
        // The storm is under way (a first file of this round closed), then the kill lands at a
        // random moment of it.
        let deadline = Instant::now() + Duration::from_secs(60);
        while closed.load(Ordering::SeqCst) == 0 {
            assert!(!writer.is_finished(), "round {round}: the storm stopped before closing a file");
            assert!(Instant::now() < deadline, "round {round}: no file closed within 60 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..1200)));
        d.kill9();
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        eprintln!("round {round}: killed; {} closed files in the manifest", manifest.lock().unwrap().len());
    }
    // Last restart: everything still there; then a clean stop.
    let mut d = start(dir.path(), &config, port, rounds);
    let scope_id = scope.unwrap();
    let mnt = d.mount_root.join(&scope_id);
    verify(&mnt, &manifest, rounds);
    assert!(manifest.lock().unwrap().len() >= rounds, "the storm wrote too little to prove anything");
    let status = d.terminate(Duration::from_secs(60));
    assert!(status.success(), "SIGTERM exit: {status}; log:\n{}", d.log_text());
    check_metadata_and_objects(dir.path(), &scope_id, &manifest);
}

fn verify(mnt: &Path, manifest: &Manifest, round: usize) {
    for (name, want) in manifest.lock().unwrap().iter() {
        let got = std::fs::read(mnt.join(name)).unwrap_or_else(|e| panic!("round {round}: {name} unreadable: {e}"));
        assert_eq!(&sha(&got), want, "round {round}: {name} lost its closed content");
    }
}

/// Opens the stopped daemon's data with the engine: sound metadata, nothing damaged, and the object
/// store alone (fresh cache and staging) serves every manifest file.
fn check_metadata_and_objects(root: &Path, scope_id: &str, manifest: &Manifest) {
    use scopefs::engine::*;
    use scopefs::store::{LocalDirStore, ObjectStore};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let scope = scopefs::ids::ScopeId::parse(scope_id).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalDirStore::new(root.join("objects")).unwrap());
    let settings = StorageSettings { block_size: 65536, ..Default::default() };
    let quota = Quota { bytes: 1 << 40, inodes: 1 << 20 };
    {
        let storage = Storage::new(store.clone(), settings.clone(), &root.join("data"), rt.handle().clone()).unwrap();
        let e = storage.open_scope(&scope, quota).unwrap();
        assert_eq!(e.integrity_check().unwrap(), "ok");
        assert_eq!(e.consistency_problems().unwrap(), Vec::<String>::new());
        assert!(e.wait_uploads(Duration::from_secs(60)), "journal replay finishes");
        let report = e.fsck(false).unwrap();
        assert!(report.damaged_files.is_empty(), "no file points at a missing block: {:?}", report.damaged_files);
    }
    let fresh = tempfile::tempdir().unwrap();
    let meta_dir = fresh.path().join("scopes").join(scope_id);
    std::fs::create_dir_all(&meta_dir).unwrap();
    // The daemon stopped and the engine above closed the database: copy it with its WAL, if any.
    let src_dir = root.join("data/scopes").join(scope_id);
    for f in ["meta.sqlite3", "meta.sqlite3-wal"] {
        if src_dir.join(f).exists() {
            std::fs::copy(src_dir.join(f), meta_dir.join(f)).unwrap();
        }
    }
    let storage = Storage::new(store, settings, fresh.path(), rt.handle().clone()).unwrap();
    let e = storage.open_scope(&scope, quota).unwrap();
    for (name, want) in manifest.lock().unwrap().iter() {
        let attr = e.lookup(ROOT_INO, name.as_bytes()).unwrap();
        let h = e.open(attr.ino, OpenFlags::default()).unwrap();
        let data = e.read(attr.ino, h.fh, 0, attr.size as u32).unwrap();
        e.release(attr.ino, h.fh).unwrap();
        assert_eq!(&sha(&data), want, "{name} from the object store alone");
    }
}
