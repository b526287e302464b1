//! Acceptance c (issue 10), power-loss half: with the engine's data directory and its object
//! directory on the recording filesystem of the crash harness (tests/crashsim_support), the
//! image a power loss leaves (every op after the last sync of its file or directory dropped:
//! the strictest POSIX state) loses nothing that was fsynced (nor anything committed before a
//! later fsync of the scope), the scope opens cleanly from it, and `close()` alone issues no
//! disk flush.

pub mod crashsim_support;

recorder_process!();

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crashsim_support::harness::{quota, settings, storage_at, Rig};
use crashsim_support::recorder::Recording;
use crashsim_support::states::power_loss_family;
use scopefs::engine::*;
use scopefs::store::{LocalDirStore, ObjectStore};

const OWNER: Owner = Owner { uid: 0, gid: 0 };
const BLOCK: u64 = 65536;
const WAIT: Duration = Duration::from_secs(60);

fn with(durability: Durability, inline: u64) -> StorageSettings {
    StorageSettings { durability, ..settings(BLOCK, inline) }
}

/// Small blocks journaled inline, the rest staging files.
fn inline(durability: Durability) -> StorageSettings {
    with(durability, BLOCK)
}

/// Every dirty block a staging file (no inline journal): blocks and metadata flushed separately.
fn staging_files_only(durability: Durability) -> StorageSettings {
    with(durability, 0)
}

/// Deterministic content of file `i` (sizes from empty to several blocks).
fn content(i: usize, version: u8) -> Vec<u8> {
    let len = [0, 1, 4096, BLOCK as usize, BLOCK as usize + 17, 3 * BLOCK as usize + 5][i % 6] + i;
    (0..len).map(|k| (k as u8).wrapping_mul(31).wrapping_add(i as u8).wrapping_add(version)).collect()
}

/// create + write + (fsync) + close through the engine, as the FUSE adapter calls it.
fn write(e: &ScopeEngine, name: &str, data: &[u8], fsync: bool) {
    let flags = OpenFlags { write: true, truncate: true, exclusive: false };
    let (attr, h) = match e.lookup(ROOT_INO, name.as_bytes()) {
        Ok(a) => {
            let h = e.open(a.ino, flags).unwrap();
            (a, h)
        }
        Err(_) => e.create(ROOT_INO, name.as_bytes(), 0o644, flags, OWNER).unwrap(),
    };
    e.write(attr.ino, h.fh, 0, data).unwrap();
    if fsync {
        e.fsync(attr.ino, Some(h.fh)).unwrap();
    }
    e.flush(attr.ino, h.fh).unwrap();
    e.release(attr.ino, h.fh).unwrap();
}

fn read(e: &ScopeEngine, name: &str) -> EngineResult<Vec<u8>> {
    let attr = e.lookup(ROOT_INO, name.as_bytes())?;
    let h = e.open(attr.ino, OpenFlags::default())?;
    let data = e.read(attr.ino, h.fh, 0, (attr.size as u32).max(1));
    e.release(attr.ino, h.fh)?;
    let data = data?;
    assert_eq!(data.len() as u64, attr.size, "{name}: read length matches the size");
    Ok(data)
}

/// The strictest power-loss image of the recording so far (none of the unsynced ops), written
/// out at `dest`.
fn power_loss_image(rec: &Recording, dest: &Path) {
    let family = power_loss_family(rec, rec.log.len(), 1);
    let none = family.iter().find(|s| s.label == "none of the unsynced ops").expect("the synced-only state");
    none.build(rec).materialize(dest).expect("write the image");
}

/// The engine on an image (a restart after the power loss), with its own runtime.
struct Reopened {
    engine: Arc<ScopeEngine>,
    store: Arc<dyn ObjectStore>,
    rt: tokio::runtime::Runtime,
}

fn reopen(image: &Path, rig_scope: &scopefs::ids::ScopeId, config: &StorageSettings) -> Reopened {
    let rt = crashsim_support::harness::runtime();
    let engine = storage_at(image, config, rt.handle()).unwrap().open_scope(rig_scope, quota()).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalDirStore::new(image.join("objects")).unwrap());
    Reopened { engine, store, rt }
}

fn block_key(scope: &scopefs::ids::ScopeId, data: &[u8]) -> String {
    use sha2::Digest;
    scopefs::store::block_key(scope.as_str(), &hex::encode(sha2::Sha256::digest(data)))
}

#[test]
fn a_power_loss_loses_nothing_that_was_fsynced() {
    loses_nothing_fsynced(inline(Durability::Fsync));
}

#[test]
fn a_power_loss_loses_nothing_that_was_fsynced_with_staging_files_only() {
    loses_nothing_fsynced(staging_files_only(Durability::Fsync));
}

fn loses_nothing_fsynced(config: StorageSettings) {
    let rig = Rig::new(&config);
    let e = rig.engine();
    // Phase 1: fsynced files, and closed-only files, interleaved.
    let mut must_survive = Vec::new();
    for i in 0..12 {
        write(e, &format!("synced-{i}"), &content(i, 0), true);
        must_survive.push((format!("synced-{i}"), content(i, 0)));
        write(e, &format!("closed-early-{i}"), &content(i, 1), false);
    }
    // Phase 2: one more fsync: everything the scope committed before it must survive too.
    write(e, "last-synced", &content(5, 2), true);
    must_survive.push(("last-synced".to_string(), content(5, 2)));
    for i in 0..12 {
        must_survive.push((format!("closed-early-{i}"), content(i, 1)));
    }
    // Phase 3: closed after the last fsync (may be lost), and an overwrite of a synced file
    // without fsync (old or new version, never a mix or damage).
    for i in 0..8 {
        write(e, &format!("closed-late-{i}"), &content(i, 3), false);
    }
    write(e, "synced-4", &content(4, 9), false);
    must_survive.retain(|(n, _)| n != "synced-4");
    assert!(e.pending_uploads() > 0, "closed files' blocks were still only in staging at the power loss");
    let scope = rig.scope.clone();
    let (rec, dir) = rig.finish();
    let image = dir.path().join("after-power-loss");
    power_loss_image(&rec, &image);

    let r = reopen(&image, &scope, &config);
    assert_eq!(r.engine.integrity_check().unwrap(), "ok", "metadata database intact");
    assert_eq!(r.engine.consistency_problems().unwrap(), Vec::<String>::new());
    for (name, want) in &must_survive {
        let got = read(&r.engine, name).unwrap_or_else(|err| panic!("{name} lost by the power loss: {err}"));
        assert!(got == *want, "{name}: content after power loss differs ({} bytes, want {})", got.len(), want.len());
    }
    let overwritten = read(&r.engine, "synced-4").expect("synced-4 readable");
    assert!(overwritten == content(4, 0) || overwritten == content(4, 9), "synced-4 is its old or its new version");
    assert!(r.engine.wait_uploads(WAIT), "journal replay finishes");
    let report = r.engine.fsck(false).unwrap();
    // Files closed after the last fsync may be lost or damaged (fs/SEMANTICS.md); nothing else.
    let unsynced: Vec<String> = report.damaged_files.iter().filter(|p| !p.contains("closed-late-")).cloned().collect();
    assert!(unsynced.is_empty(), "only files closed after the last fsync may be damaged: {:?}", report.damaged_files);
}

/// Syncs (of files and directories) the recording logged between ops `from` and `to`.
fn syncs(rec: &Recording, from: usize) -> usize {
    rec.log[from..].iter().filter(|op| op.is_sync()).count()
}

#[test]
fn close_alone_issues_no_disk_flush_and_fsync_does() {
    let rig = Rig::new(&inline(Durability::Fsync));
    let e = rig.engine();
    let before = rig.recorder().ops();
    for i in 0..10 {
        write(e, &format!("f{i}"), &content(i, 0), false);
    }
    e.mkdir(ROOT_INO, b"dir", 0o755, OWNER).unwrap();
    assert_eq!(syncs(&rig.recorder().recording(), before), 0, "create + write + close of ten files flushed the disk");
    assert_eq!(e.local_flushes(), 0);

    write(e, "synced", &content(3, 0), true);
    assert!(syncs(&rig.recorder().recording(), before) >= 2, "fsync flushes the journal file and the metadata WAL");
    assert_eq!(e.local_flushes(), 1, "one grouped flush");
    let after_fsync = rig.recorder().ops();
    e.fsync_dir().unwrap();
    let dir_flushes = syncs(&rig.recorder().recording(), after_fsync);
    assert!((1..=2).contains(&dir_flushes), "an fsyncdir with nothing new only flushes the WAL: {dir_flushes}");
    drop(rig.finish());
}

#[test]
fn close_durability_mode_makes_close_a_flush() {
    let rig = Rig::new(&inline(Durability::Close));
    let e = rig.engine();
    let before = rig.recorder().ops();
    write(e, "f", &content(4, 0), false);
    // The block is in the store before close returns, and the metadata WAL is flushed.
    assert_eq!(e.pending_uploads(), 0, "close() in close mode uploads before it returns");
    assert!(syncs(&rig.recorder().recording(), before) >= 1, "and flushes the metadata WAL");
    assert_eq!(e.local_flushes(), 1, "one grouped flush");
    drop(rig.finish());
}

/// The worst case of a file closed but never fsynced: the host wrote its metadata back (here a
/// WAL checkpoint, as SQLite or the page cache may do at any time) but not its block. After the
/// power loss the damaged staged block is never uploaded under its hash: the file reads `EIO`
/// (never wrong bytes) and fsck names it; fsynced files are untouched.
#[test]
fn a_block_lost_before_its_flush_is_never_uploaded_and_reads_fail_cleanly() {
    let config = staging_files_only(Durability::Fsync);
    let lost = content(2, 7);
    let (image, scope, _dir) = closed_file_through_a_checkpoint_and_a_power_loss(&config, &lost);
    let r = reopen(&image, &scope, &config);
    assert!(r.engine.wait_uploads(WAIT), "journal replay finishes");
    assert_eq!(read(&r.engine, "synced").unwrap(), content(3, 0));
    let key = block_key(&scope, &lost);
    assert!(r.rt.block_on(r.store.head(&key)).unwrap().is_none(), "damaged bytes were uploaded under the block's hash");
    assert!(read(&r.engine, "closed").is_err(), "a damaged file reads EIO, never wrong bytes");
    let report = r.engine.fsck(false).unwrap();
    assert_eq!(report.damaged_files, vec!["/closed".to_string()], "fsck names the damaged file");
}

/// The same worst case with the inline journal: a small block is written by the very SQLite commit
/// that references it, so whatever makes that commit durable (here a checkpoint) makes its bytes
/// durable too. The closed file is intact after the power loss and is uploaded from the journal.
#[test]
fn an_inline_block_is_durable_exactly_when_its_commit_is() {
    let config = inline(Durability::Fsync);
    let small = content(2, 7);
    let (image, scope, _dir) = closed_file_through_a_checkpoint_and_a_power_loss(&config, &small);
    let r = reopen(&image, &scope, &config);
    assert_eq!(read(&r.engine, "synced").unwrap(), content(3, 0));
    assert_eq!(read(&r.engine, "closed").unwrap(), small, "the bytes were durable with their commit");
    assert!(r.engine.wait_uploads(WAIT), "journal replay finishes");
    let key = block_key(&scope, &small);
    assert!(r.rt.block_on(r.store.head(&key)).unwrap().is_some(), "uploaded from the journal");
    assert!(r.engine.fsck(false).unwrap().damaged_files.is_empty());
}

/// Writes `synced` (fsynced) and `closed` (`data`, closed only; its upload waits an hour), lets
/// the metadata checkpoint, and writes out the power-loss image. Returns the image's path, the
/// scope and the directory holding both.
fn closed_file_through_a_checkpoint_and_a_power_loss(
    config: &StorageSettings,
    data: &[u8],
) -> (std::path::PathBuf, scopefs::ids::ScopeId, tempfile::TempDir) {
    let rig = Rig::new(config);
    let e = rig.engine();
    write(e, "synced", &content(3, 0), true);
    write(e, "closed", data, false);
    // The closed file's version reaches the database file (a checkpoint flushes it) while its
    // block was never flushed.
    assert!(e.checkpoint_metadata().unwrap(), "checkpoint ran");
    let scope = rig.scope.clone();
    let rec = rig.recorder().recording();
    let (_, dir) = rig.finish();
    let image = dir.path().join("after-power-loss");
    power_loss_image(&rec, &image);
    (image, scope, dir)
}

/// `ScopeEngine::sync` (the engine's syncfs): every closed file survives a power loss and has its
/// blocks in the object store when it returns.
#[test]
fn sync_makes_every_closed_file_durable_and_uploaded() {
    let config = inline(Durability::Fsync);
    let rig = Rig::new(&config);
    let e = rig.engine();
    for i in 0..6 {
        write(e, &format!("f{i}"), &content(i, 4), false);
    }
    e.sync().unwrap();
    let scope = rig.scope.clone();
    let (rec, dir) = rig.finish();
    let image = dir.path().join("after-power-loss");
    power_loss_image(&rec, &image);
    let r = reopen(&image, &scope, &config);
    for i in 0..6 {
        for chunk in content(i, 4).chunks(BLOCK as usize) {
            let key = block_key(&scope, chunk);
            assert!(r.rt.block_on(r.store.head(&key)).unwrap().is_some(), "f{i}: a block not uploaded");
        }
    }
    for i in 0..6 {
        assert_eq!(read(&r.engine, &format!("f{i}")).unwrap(), content(i, 4), "f{i} after the power loss");
    }
    assert!(r.engine.fsck(false).unwrap().damaged_files.is_empty());
}
