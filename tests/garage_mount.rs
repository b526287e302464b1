//! Garage as the backend (SPEC §12 tier 4): blocks reach the bucket on fsync, a fresh
//! daemon with empty cache and staging reads identical bytes, queued uploads survive
//! a Garage outage while fsync fails with EIO instead of hanging, and online gc reclaims the
//! blocks of rewritten files while a writer and a reader use the mount.
//!
//! Needs root, /dev/fuse and the `SCOPEFS_TEST_S3_*` / `SCOPEFS_TEST_GARAGE_CONFIG`
//! environment set by `scripts/test.sh`; a missing prerequisite fails the test.
//! The tests stop and start Garage, so they run one at a time (a process-wide lock).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use scopefs::engine::{Durability, OpenFlags, Owner, Quota, Storage, StorageSettings, ROOT_INO};
use scopefs::ids::ScopeId;
use scopefs::store::{ObjectStore, S3Settings, S3Store};
use scopefs_fs::{MountManager, MountOptions};
use sha2::{Digest, Sha256};

const MIB: usize = 1024 * 1024;

static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the lock that keeps these tests (which stop Garage) from overlapping.
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn required_env(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{name} is not set: these tests need a running Garage server; run them through \
             scripts/test.sh (or `scripts/garage.sh start && eval \"$(scripts/garage.sh env)\"`)"
        ),
    }
}

fn garage_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/garage.sh")
}

/// Runs `scripts/garage.sh <cmd>` against the server described by the test environment.
fn garage(cmd: &str) {
    let config = required_env("SCOPEFS_TEST_GARAGE_CONFIG");
    let out = Command::new("bash")
        .arg(garage_script())
        .arg(cmd)
        .env("SCOPEFS_TEST_GARAGE_CONFIG", &config)
        .env_remove("SCOPEFS_TEST_STATE")
        .output()
        .expect("run scripts/garage.sh");
    assert!(
        out.status.success(),
        "scripts/garage.sh {cmd} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Pid of the running Garage server (from the pid file next to its config).
fn garage_pid() -> i32 {
    let config = PathBuf::from(required_env("SCOPEFS_TEST_GARAGE_CONFIG"));
    let pidfile = config.parent().expect("config dir").join("garage.pid");
    let text = fs::read_to_string(&pidfile).expect("read the garage pid file");
    text.trim().parse().expect("garage pid")
}

/// Brings Garage back (continued and started) when a test ends, even by panic.
struct GarageBack;

impl Drop for GarageBack {
    fn drop(&mut self) {
        if let Ok(text) = std::env::var("SCOPEFS_TEST_GARAGE_CONFIG") {
            let pidfile = Path::new(&text).parent().map(|d| d.join("garage.pid"));
            if let Some(pid) = pidfile.and_then(|p| fs::read_to_string(p).ok()).and_then(|t| t.trim().parse().ok()) {
                // SAFETY: plain kill(2) on the recorded Garage pid.
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
            let _ = Command::new("bash").arg(garage_script()).arg("start").status();
        }
    }
}

/// The S3 store of the test bucket under a prefix unique to this test run.
fn garage_store(label: &str) -> (Arc<dyn ObjectStore>, String) {
    let prefix = format!("garage-mount/{label}-{}", uuid::Uuid::now_v7());
    let settings = S3Settings {
        endpoint: Some(required_env("SCOPEFS_TEST_S3_ENDPOINT")),
        region: required_env("SCOPEFS_TEST_S3_REGION"),
        bucket: required_env("SCOPEFS_TEST_S3_BUCKET"),
        prefix: prefix.clone(),
        path_style: true,
        access_key_id: Some(required_env("SCOPEFS_TEST_S3_ACCESS_KEY_ID")),
        secret_access_key: Some(required_env("SCOPEFS_TEST_S3_SECRET_ACCESS_KEY")),
    };
    (Arc::new(S3Store::new(settings).expect("S3 store for Garage")), prefix)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn quota() -> Quota {
    Quota { bytes: 1 << 34, inodes: 100_000 }
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::fill(&mut v[..]);
    v
}

fn sha_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Expected block objects of `data`: SHA-256 of each `block`-sized piece, with its size.
fn expected_blocks(data: &[u8], block: u64) -> BTreeMap<String, u64> {
    data.chunks(block as usize).map(|c| (sha_hex(c), c.len() as u64)).collect()
}

/// Block objects of a scope as listed through the S3 API: sha -> size.
fn listed_blocks(rt: &tokio::runtime::Runtime, store: &Arc<dyn ObjectStore>, scope: &ScopeId) -> BTreeMap<String, u64> {
    let prefix = format!("scopes/{scope}/blocks/");
    let listed = rt.block_on(store.list(&prefix)).expect("list blocks through the S3 API");
    listed.into_iter().map(|o| (o.key[prefix.len()..].to_string(), o.size)).collect()
}

fn assert_blocks_listed(listed: &BTreeMap<String, u64>, expected: &BTreeMap<String, u64>, what: &str) {
    for (sha, size) in expected {
        assert_eq!(listed.get(sha), Some(size), "{what}: block {sha} missing from the bucket listing");
    }
}

/// A fresh data directory holding nothing but the scope's metadata database.
fn fresh_data_dir_with_meta(old: &Path, scope: &ScopeId) -> tempfile::TempDir {
    let fresh = tempfile::tempdir().expect("tempdir");
    let from = old.join("scopes").join(scope.as_str());
    let to = fresh.path().join("scopes").join(scope.as_str());
    fs::create_dir_all(&to).expect("mkdir scopes/<id>");
    fs::copy(from.join("meta.sqlite3"), to.join("meta.sqlite3")).expect("copy meta.sqlite3");
    // A write-ahead log left by a still-open connection is part of the same database.
    let wal = from.join("meta.sqlite3-wal");
    if wal.exists() {
        fs::copy(&wal, to.join("meta.sqlite3-wal")).expect("copy meta.sqlite3-wal");
    }
    fresh
}

fn delete_prefix(rt: &tokio::runtime::Runtime, store: &Arc<dyn ObjectStore>) {
    if let Ok(all) = rt.block_on(store.list("")) {
        for o in all {
            let _ = rt.block_on(store.delete(&o.key));
        }
    }
}

fn is_eio(err: &std::io::Error) -> bool {
    err.raw_os_error() == Some(libc::EIO)
}

#[test]
fn engine_blocks_reach_bucket_and_fresh_storage_reads_them() {
    let _lock = serial();
    garage("start");
    let rt = runtime();
    let (store, _prefix) = garage_store("engine");
    let settings = StorageSettings::default();
    let block = settings.block_size;
    let data1 = tempfile::tempdir().expect("tempdir");
    let scope = ScopeId::generate();
    let content = random_bytes(9 * MIB + 123);
    {
        let storage =
            Storage::new(store.clone(), settings.clone(), data1.path(), rt.handle().clone()).expect("storage");
        let engine = storage.open_scope(&scope, quota()).expect("open scope");
        let flags = OpenFlags { write: true, truncate: false, exclusive: true };
        let (attr, opened) = engine.create(ROOT_INO, b"big.bin", 0o644, flags, Owner::default()).expect("create");
        for (i, piece) in content.chunks(MIB).enumerate() {
            let n = engine.write(attr.ino, opened.fh, (i * MIB) as u64, piece).expect("write");
            assert_eq!(n as usize, piece.len());
        }
        engine.fsync(attr.ino, Some(opened.fh)).expect("fsync");
        // fsync returned: every block is in the bucket now, before any waiting.
        let listed = listed_blocks(&rt, &store, &scope);
        let expected = expected_blocks(&content, block);
        assert_eq!(expected.len(), 3, "9 MiB in 4 MiB blocks");
        assert_blocks_listed(&listed, &expected, "after fsync");
        assert_eq!(listed.len(), expected.len(), "no extra block objects: {listed:?}");
        engine.release(attr.ino, opened.fh).expect("release");
        assert!(engine.wait_uploads(Duration::from_secs(60)), "uploads did not drain");
    }

    // A new storage: empty cache and staging, only the metadata database carried over.
    let data2 = fresh_data_dir_with_meta(data1.path(), &scope);
    drop(data1);
    let storage = Storage::new(store.clone(), settings, data2.path(), rt.handle().clone()).expect("fresh storage");
    let engine = storage.open_scope(&scope, quota()).expect("reopen scope");
    assert_eq!(storage.cache_counts(), (0, 0), "fresh storage starts with an empty cache");
    let attr = engine.lookup(ROOT_INO, b"big.bin").expect("lookup");
    assert_eq!(attr.size, content.len() as u64);
    let opened = engine.open(attr.ino, OpenFlags::default()).expect("open");
    let mut back = Vec::with_capacity(content.len());
    loop {
        let piece = engine.read(attr.ino, opened.fh, back.len() as u64, MIB as u32).expect("read");
        if piece.is_empty() {
            break;
        }
        back.extend_from_slice(&piece);
    }
    engine.release(attr.ino, opened.fh).expect("release");
    assert_eq!(back.len(), content.len());
    assert_eq!(sha_hex(&back), sha_hex(&content), "content read from Garage differs");
    assert!(storage.cache_counts().1 > 0, "the read must have missed the empty cache and fetched from Garage");
    drop(engine);
    drop(storage);
    delete_prefix(&rt, &store);
}

#[test]
fn fuse_write_fsync_then_fresh_daemon_reads_identical_content() {
    let _lock = serial();
    garage("start");
    let rt = runtime();
    let (store, _prefix) = garage_store("fuse");
    let settings = StorageSettings::default();
    let data1 = tempfile::tempdir().expect("tempdir");
    let mounts1 = tempfile::tempdir().expect("tempdir");
    let scope = ScopeId::generate();
    let content = random_bytes(9 * MIB);
    {
        let storage =
            Storage::new(store.clone(), settings.clone(), data1.path(), rt.handle().clone()).expect("storage");
        let engine = storage.open_scope(&scope, quota()).expect("open scope");
        let manager = MountManager::new(&mounts1.path().join("m"), MountOptions::default()).expect("mount manager");
        let mnt = manager.mount(engine.clone()).expect("mount");
        fs::create_dir(mnt.join("data")).expect("mkdir through the mount");
        let mut f = File::create(mnt.join("data/big.bin")).expect("create through the mount");
        f.write_all(&content).expect("write through the mount");
        f.sync_all().expect("fsync through the mount");
        drop(f);

        let listed = listed_blocks(&rt, &store, &scope);
        let expected = expected_blocks(&content, settings.block_size);
        assert_eq!(expected.len(), 3, "9 MiB in 4 MiB blocks");
        assert_blocks_listed(&listed, &expected, "after fsync through the mount");
        assert_eq!(listed.len(), expected.len(), "no extra block objects: {listed:?}");

        manager.unmount(&scope).expect("unmount");
        assert!(engine.wait_uploads(Duration::from_secs(60)), "uploads did not drain");
    }

    // A "fresh daemon": new storage with empty cache/staging, new mount manager.
    let data2 = fresh_data_dir_with_meta(data1.path(), &scope);
    drop(data1);
    let mounts2 = tempfile::tempdir().expect("tempdir");
    let storage = Storage::new(store.clone(), settings, data2.path(), rt.handle().clone()).expect("fresh storage");
    let engine = storage.open_scope(&scope, quota()).expect("reopen scope");
    assert_eq!(storage.cache_counts(), (0, 0), "fresh storage starts with an empty cache");
    let manager = MountManager::new(&mounts2.path().join("m"), MountOptions::default()).expect("mount manager");
    let mnt = manager.mount(engine.clone()).expect("mount again");
    let meta = fs::metadata(mnt.join("data/big.bin")).expect("stat after remount");
    assert_eq!(meta.len(), content.len() as u64);
    let back = fs::read(mnt.join("data/big.bin")).expect("read through the fresh mount");
    assert_eq!(sha_hex(&back), sha_hex(&content), "content read from Garage differs");
    assert!(storage.cache_counts().1 > 0, "the read must have fetched from Garage");
    manager.unmount(&scope).expect("unmount");
    drop(manager);
    drop(engine);
    drop(storage);
    delete_prefix(&rt, &store);
}

/// Opens `path`, appends `extra`, and times an fsync that must fail with EIO.
fn fsync_must_fail_with_eio(path: &Path, extra: &[u8], bound: Duration, what: &str) {
    let mut f = OpenOptions::new().append(true).open(path).expect("open for append");
    f.write_all(extra).expect("append");
    let started = Instant::now();
    let res = f.sync_all();
    let took = started.elapsed();
    match res {
        Err(e) if is_eio(&e) => {}
        other => panic!("{what}: fsync gave {other:?}, want EIO"),
    }
    assert!(took < bound, "{what}: fsync took {took:?}, longer than {bound:?}");
    // close() only journals in writeback mode: it must still succeed.
    drop(f);
}

#[test]
fn queued_uploads_complete_after_garage_outage() {
    let _lock = serial();
    garage("start");
    let _restore = GarageBack;
    let rt = runtime();
    let (store, _prefix) = garage_store("outage");
    let settings = StorageSettings {
        durability: Durability::Fsync,
        store_timeout: Duration::from_secs(2),
        store_attempts: 2,
        ..StorageSettings::default()
    };
    // Two attempts of 2 s plus a short backoff, with generous slack for a loaded machine.
    let fsync_bound = Duration::from_secs(20);
    let block = settings.block_size;
    let data = tempfile::tempdir().expect("tempdir");
    let mounts = tempfile::tempdir().expect("tempdir");
    let scope = ScopeId::generate();
    let storage = Storage::new(store.clone(), settings, data.path(), rt.handle().clone()).expect("storage");
    let engine = storage.open_scope(&scope, quota()).expect("open scope");
    let manager = MountManager::new(&mounts.path().join("m"), MountOptions::default()).expect("mount manager");
    let mnt = manager.mount(engine.clone()).expect("mount");

    let mut files: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
    // Baseline while Garage is up.
    let a = random_bytes(5 * MIB);
    let mut f = File::create(mnt.join("a.bin")).expect("create a");
    f.write_all(&a).expect("write a");
    f.sync_all().expect("fsync a with Garage up");
    drop(f);
    files.insert("a.bin", a);

    // Garage frozen (accepts connections, never answers): fsync must time out into EIO.
    let b = random_bytes(MIB + 7);
    fs::write(mnt.join("b.bin"), &b).expect("write b");
    let pid = garage_pid();
    // SAFETY: plain kill(2) on the Garage pid recorded by scripts/garage.sh.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP garage");
    let tail = b"frozen tail".to_vec();
    fsync_must_fail_with_eio(&mnt.join("b.bin"), &tail, fsync_bound, "Garage frozen");
    files.insert("b.bin", [b, tail].concat());
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0, "SIGCONT garage");

    // Garage stopped: writes and closes succeed (journaled), uploads queue up.
    garage("stop");
    let c = random_bytes(6 * MIB + 5);
    fs::write(mnt.join("c.bin"), &c).expect("write c while Garage is down (close must succeed)");
    let d = random_bytes(100 * 1024);
    fs::write(mnt.join("d.bin"), &d).expect("write d while Garage is down");
    assert!(engine.pending_uploads() > 0, "blocks written while Garage is down must be queued");
    // Reads are served locally while the store is down.
    assert_eq!(sha_hex(&fs::read(mnt.join("c.bin")).expect("read c while down")), sha_hex(&c));
    let tail = b"stopped tail".to_vec();
    fsync_must_fail_with_eio(&mnt.join("c.bin"), &tail, fsync_bound, "Garage stopped");
    files.insert("c.bin", [c, tail].concat());
    files.insert("d.bin", d);
    assert!(engine.pending_uploads() > 0, "uploads still queued while Garage is down");
    assert!(!engine.wait_uploads(Duration::from_secs(1)), "uploads cannot drain while Garage is down");

    // Garage back: the queue drains and every block of every file is in the bucket.
    garage("start");
    assert!(engine.wait_uploads(Duration::from_secs(90)), "queued uploads did not complete after Garage came back");
    assert_eq!(engine.pending_uploads(), 0);
    let listed = listed_blocks(&rt, &store, &scope);
    for (name, body) in &files {
        assert_blocks_listed(&listed, &expected_blocks(body, block), name);
        assert_eq!(sha_hex(&fs::read(mnt.join(name)).expect("read back")), sha_hex(body), "{name} content");
    }
    // fsync works again.
    let f = OpenOptions::new().append(true).open(mnt.join("d.bin")).expect("open d");
    f.sync_all().expect("fsync after Garage came back");
    drop(f);

    manager.unmount(&scope).expect("unmount");
    drop(manager);
    drop(engine);
    drop(storage);
    delete_prefix(&rt, &store);
}

/// Bytes written to `path` through the mount as one version: in place (truncated, then written,
/// fsynced when `sync`), or beside it and renamed over it.
fn write_version(dir: &Path, name: &str, data: &[u8], in_place: bool, sync: bool) {
    let target = dir.join(name);
    let path = if in_place { target.clone() } else { dir.join(format!(".{name}.tmp")) };
    let mut f = File::create(&path).expect("create through the mount");
    f.write_all(data).expect("write through the mount");
    if sync {
        f.sync_all().expect("fsync through the mount");
    }
    drop(f);
    if !in_place {
        fs::rename(&path, &target).expect("rename over through the mount");
    }
}

/// The first 4 KiB page of `got` that is not the same page of any of `versions`; `None` when each
/// is. A whole-file read through a mount is many reads: one that spans a rewrite in place may mix
/// versions page by page (as on any POSIX file system), but never shows a byte no version wrote
/// there (a lost block, zeros, another file's bytes).
fn page_of_no_version(got: &[u8], versions: &[Vec<u8>]) -> Option<usize> {
    got.chunks(4096).enumerate().map(|(i, page)| (i, i * 4096, page)).find_map(|(i, at, page)| {
        let known = versions.iter().any(|v| v.get(at..at + page.len()) == Some(page));
        (!known).then_some(i)
    })
}

/// Issue 24 item 7, acceptance c, through a FUSE mount on Garage: six files rewritten 10 times (in
/// place and by rename, fsynced or not) while a writer keeps writing, a reader reads through the
/// mount and online gc runs. Every read shows, page by page, what some version wrote there (never
/// EIO, never a byte of no version: `page_of_no_version`); afterwards the bucket holds exactly the
/// blocks of the files' last versions and fsck is clean.
#[test]
fn online_gc_reclaims_rewritten_blocks_under_a_writer_and_a_reader_on_garage() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let _lock = serial();
    garage("start");
    let rt = runtime();
    let (store, _prefix) = garage_store("gc");
    let settings = StorageSettings {
        block_size: 256 * 1024,
        metadata_sync: Some(Duration::from_millis(200)),
        ..StorageSettings::default()
    };
    let block = settings.block_size;
    let data = tempfile::tempdir().expect("tempdir");
    let mounts = tempfile::tempdir().expect("tempdir");
    let scope = ScopeId::generate();
    let storage = Storage::new(store.clone(), settings, data.path(), rt.handle().clone()).expect("storage");
    let engine = storage.open_scope(&scope, quota()).expect("open scope");
    let manager = MountManager::new(&mounts.path().join("m"), MountOptions::default()).expect("mount manager");
    let mnt = manager.mount(engine.clone()).expect("mount");
    let dir = mnt.join("work");
    fs::create_dir(&dir).expect("mkdir through the mount");
    const FILES: usize = 6;
    // versions[file][v]: every version ever written of each file (the busy file is FILES).
    let versions: Vec<Mutex<Vec<Vec<u8>>>> = (0..=FILES).map(|_| Mutex::new(Vec::new())).collect();
    let (done, passes, deleted) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|t| {
        t.spawn(|| {
            for round in 0..=10usize {
                for (f, kept) in versions.iter().enumerate().take(FILES) {
                    let v = random_bytes(3 * block as usize + 1000);
                    kept.lock().unwrap().push(v.clone());
                    write_version(&dir, &format!("f{f}"), &v, round % 2 == 0, (round + f) % 3 == 0);
                }
            }
            // It keeps writing until gc has reclaimed blocks in at least two passes meanwhile.
            let deadline = Instant::now() + Duration::from_secs(120);
            while passes.load(Ordering::SeqCst) < 2 {
                assert!(Instant::now() < deadline, "gc reclaimed nothing while the writer wrote");
                let v = random_bytes(2 * block as usize);
                versions[FILES].lock().unwrap().push(v.clone());
                write_version(&dir, "busy", &v, false, true);
            }
            done.store(true, Ordering::SeqCst);
        });
        t.spawn(|| {
            let mut n = 0usize;
            while !done.load(Ordering::SeqCst) {
                let f = n % FILES;
                n += 1;
                let got = match fs::read(dir.join(format!("f{f}"))) {
                    Ok(got) => got,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue, // not written yet
                    Err(e) => panic!("reading f{f} through the mount: {e}"),
                };
                let kept = versions[f].lock().unwrap();
                if let Some(page) = page_of_no_version(&got, &kept) {
                    panic!("f{f}: {} bytes read; page {page} is that page of no version", got.len());
                }
            }
        });
        t.spawn(|| {
            while !done.load(Ordering::SeqCst) {
                let r = engine.collect_garbage_online(Duration::ZERO, u64::MAX).expect("online gc pass");
                if r.blocks_deleted > 0 {
                    deleted.fetch_add(r.blocks_deleted, Ordering::SeqCst);
                    passes.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    });
    engine.sync().expect("sync");
    assert!(engine.wait_uploads(Duration::from_secs(60)), "uploads did not drain");
    // Blocks unreferenced in the second a pass starts wait for the next one (metadata shipping):
    // the last pass starts in a later second than the last write.
    let unix = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let (written, deadline) = (unix(), Instant::now() + Duration::from_secs(3));
    while unix() <= written {
        assert!(Instant::now() < deadline, "the clock did not move on");
        std::thread::sleep(Duration::from_millis(5));
    }
    let last = engine.collect_garbage_online(Duration::ZERO, u64::MAX).expect("last pass");
    assert_eq!(last.blocks_deferred, 0, "{last:?}");
    let total = deleted.load(Ordering::SeqCst) + last.blocks_deleted;
    assert!(total >= (10 * FILES * 4) as u64, "the old versions' blocks went: {total}");
    let mut expected = BTreeMap::new();
    for kept in &versions {
        if let Some(v) = kept.lock().unwrap().last() {
            expected.extend(expected_blocks(v, block));
        }
    }
    let listed = listed_blocks(&rt, &store, &scope);
    assert_eq!(listed, expected, "the bucket holds exactly the blocks of the last versions");
    for (f, kept) in versions.iter().enumerate().take(FILES) {
        let back = fs::read(dir.join(format!("f{f}"))).expect("read through the mount");
        assert!(back == *kept.lock().unwrap().last().unwrap(), "f{f}: its last version");
    }
    let report = engine.fsck(false).expect("fsck");
    assert!(
        report.damaged_files.is_empty() && report.orphan_objects.is_empty() && report.metadata_problems.is_empty(),
        "{report:?}"
    );
    manager.unmount(&scope).expect("unmount");
    drop(manager);
    drop(engine);
    drop(storage);
    delete_prefix(&rt, &store);
}
