//! A scope's metadata database opened on first use, within a daemon-wide budget of open
//! databases: an idle mounted scope holds no SQLite connection, page cache or descriptors (its
//! mount costs one `/dev/fuse` descriptor), and past the budget the database opened longest ago
//! and not in use is closed (it reopens on its next use).
//! A closed database leaves a note of its usage and root beside it (`note.rs`).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};

use super::error::EngineResult;
use super::meta::MetaDb;
use super::note::{self, Note};
use super::requests::Answers;
use super::ship::MetaShip;
use super::types::ROOT_INO;

/// Scope metadata databases open in this process (for `/metrics` and the scale benchmark).
static OPEN_DATABASES: AtomicU64 = AtomicU64::new(0);

/// Metadata databases currently open in this process.
pub fn open_databases() -> u64 {
    OPEN_DATABASES.load(Ordering::Relaxed)
}

/// The open databases of one storage, oldest first, and how many may stay open.
pub(crate) struct MetaBudget {
    max_open: usize,
    open: Mutex<VecDeque<Weak<Slot>>>,
}

impl MetaBudget {
    /// A budget of `max_open` open databases whose memory, with every other SQLite database of
    /// the process, stays near `heap_bytes` (SQLite's soft heap limit, process-wide: page caches
    /// recycle their own pages past it instead of growing; 0 sets no limit).
    pub fn new(max_open: usize, heap_bytes: u64) -> Arc<MetaBudget> {
        // SAFETY: sets a process-wide SQLite setting; callable at any time from any thread.
        unsafe { rusqlite::ffi::sqlite3_soft_heap_limit64(i64::try_from(heap_bytes).unwrap_or(i64::MAX)) };
        Arc::new(MetaBudget { max_open: max_open.max(1), open: Mutex::new(VecDeque::new()) })
    }

    /// Commits the batches of open databases that are at least `age` old (the idle flusher); a
    /// database in use right now is skipped (its user's own mutations commit it when due).
    pub fn commit_idle(&self, age: std::time::Duration) {
        let slots: Vec<Arc<Slot>> = self.open.lock().iter().filter_map(Weak::upgrade).collect();
        for slot in slots {
            if let Some(mut db) = slot.db.try_lock() {
                if let Some(db) = db.as_mut() {
                    if let Err(e) = db.commit_batch_older_than(age) {
                        tracing::warn!(error = %e, "committing an idle metadata batch failed; its redo log keeps it");
                    }
                }
            }
        }
    }

    /// Starts the idle flusher of this budget: a thread that, every half `BATCH_AGE`, commits the
    /// batches older than `BATCH_AGE`, so a scope that stops writing has its mutations in its
    /// database soon (not only in its redo log). It ends with the budget.
    pub fn start_flusher(self: &Arc<Self>) -> std::io::Result<()> {
        let budget = Arc::downgrade(self);
        let age = super::meta::BATCH_AGE;
        std::thread::Builder::new().name("scopefs-meta-flush".into()).stack_size(256 * 1024).spawn(move || {
            while let Some(b) = budget.upgrade() {
                b.commit_idle(age);
                drop(b);
                std::thread::sleep(age / 2);
            }
        })?;
        Ok(())
    }

    /// Records a newly opened database and closes the oldest idle ones beyond the budget (a
    /// database being used right now is skipped, and stays listed).
    fn opened(&self, slot: &Arc<Slot>) {
        let mut open = self.open.lock();
        open.retain(|w| w.upgrade().is_some_and(|s| s.is_open.load(Ordering::Relaxed)));
        open.push_back(Arc::downgrade(slot));
        let mut excess = open.len().saturating_sub(self.max_open);
        let mut i = 0;
        while excess > 0 && i < open.len() {
            let closed = open[i].upgrade().is_some_and(|s| !Arc::ptr_eq(&s, slot) && s.close_if_idle());
            if closed {
                open.remove(i);
                excess -= 1;
            } else {
                i += 1;
            }
        }
    }
}

struct Slot {
    path: PathBuf,
    db: Mutex<Option<MetaDb>>,
    is_open: AtomicBool,
    /// Inodes without a name are deleted at the next open (set when the scope is mounted afresh:
    /// no kernel holds any of them then).
    collect_detached: AtomicBool,
    /// Answers of requests, shared with the engine (`requests.rs`).
    answers: Arc<Answers>,
    /// Where committed batches are shipped (`None`: not shipped).
    ship: Option<Arc<MetaShip>>,
}

impl Slot {
    fn close_if_idle(&self) -> bool {
        let Some(mut db) = self.db.try_lock() else { return false };
        if let Some(db) = db.take() {
            self.close(db);
            return true;
        }
        false
    }

    /// Closes the database (its batch commits) and leaves its usage noted when that succeeded.
    fn close(&self, mut db: MetaDb) {
        let noted = db.commit_batch_older_than(std::time::Duration::ZERO).and_then(|()| noting(&db));
        let settled = noted.is_ok() && db.uncommitted() == 0;
        drop(db);
        self.is_open.store(false, Ordering::Relaxed);
        OPEN_DATABASES.fetch_sub(1, Ordering::Relaxed);
        if let (true, Ok(n)) = (settled, noted) {
            note::write(&self.path, &n);
        }
    }
}

/// The metadata database of one scope, opened by the first `lock`.
pub(crate) struct LazyMeta {
    slot: Arc<Slot>,
    budget: Arc<MetaBudget>,
}

impl LazyMeta {
    /// A database opened on first use; `open` is an already open one (a scope recovered at once,
    /// e.g. to replay its upload journal), sharing `answers`.
    pub fn new(
        path: PathBuf,
        budget: Arc<MetaBudget>,
        mut open: Option<MetaDb>,
        answers: Arc<Answers>,
        ship: Option<Arc<MetaShip>>,
    ) -> LazyMeta {
        if let (Some(db), Some(ship)) = (open.as_mut(), &ship) {
            db.attach_ship(ship.clone());
        }
        let is_open = open.is_some();
        let slot = Arc::new(Slot {
            path,
            db: Mutex::new(open),
            is_open: AtomicBool::new(is_open),
            collect_detached: AtomicBool::new(false),
            answers,
            ship,
        });
        if is_open {
            OPEN_DATABASES.fetch_add(1, Ordering::Relaxed);
            budget.opened(&slot);
        }
        LazyMeta { slot, budget }
    }

    /// Commits the open batch of mutations, if the database is open (it is not opened for this).
    pub fn commit_if_open(&self) -> EngineResult<()> {
        match self.slot.db.lock().as_mut() {
            Some(db) => db.commit_batch_older_than(std::time::Duration::ZERO),
            None => Ok(()),
        }
    }

    /// Commits the open batch and notes the usage, as a close would: the process hands the scope
    /// over and changes nothing more.
    pub fn hand_over(&self) -> EngineResult<()> {
        if let Some(db) = self.slot.db.lock().as_mut() {
            db.commit_batch_older_than(std::time::Duration::ZERO)?;
            note::write(&self.slot.path, &noting(db)?);
        }
        Ok(())
    }

    /// What a closed database left noted (`None`: open, or no note).
    pub fn noted(&self) -> Option<Note> {
        if self.is_open() {
            return None;
        }
        note::read(&self.slot.path)
    }

    /// Mutations in the open batch (0 when the database is closed).
    pub fn uncommitted(&self) -> u32 {
        self.slot.db.lock().as_ref().map_or(0, MetaDb::uncommitted)
    }

    /// Whether the database is open now.
    pub fn is_open(&self) -> bool {
        self.slot.is_open.load(Ordering::Relaxed)
    }

    /// Deletes the inodes without a name now if the database is open, else at its next open: the
    /// scope is mounted afresh, so no kernel holds any of them.
    pub fn collect_detached(&self) -> EngineResult<()> {
        let mut guard = self.slot.db.lock();
        match guard.as_mut() {
            Some(db) => {
                self.slot.collect_detached.store(false, Ordering::Relaxed);
                db.heal()?;
                delete_detached(db)
            }
            None => {
                self.slot.collect_detached.store(true, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// The database, locked; opened (and migrated, its redo log replayed) if it is closed. A
    /// poisoned database is put back from its log first, or the caller gets `Poisoned`.
    pub fn lock(&self) -> EngineResult<MappedMutexGuard<'_, MetaDb>> {
        let mut guard = self.slot.db.lock();
        if let Some(db) = guard.as_mut() {
            db.heal()?;
        }
        if guard.is_none() {
            if let Some(ship) = &self.slot.ship {
                // A scope without a local database is restored from the bucket on first use.
                ship.restore_if_missing(&self.slot.path)?;
            }
            let mut db = MetaDb::open_with(&self.slot.path, 0, 0, self.slot.answers.clone())?;
            if let Some(ship) = &self.slot.ship {
                db.attach_ship(ship.clone());
            }
            note::forget(&self.slot.path)?;
            if self.slot.collect_detached.swap(false, Ordering::Relaxed) {
                delete_detached(&mut db)?;
            }
            *guard = Some(db);
            self.slot.is_open.store(true, Ordering::Relaxed);
            OPEN_DATABASES.fetch_add(1, Ordering::Relaxed);
            // The budget closes others, never this one (it is locked here).
            drop(guard);
            self.budget.opened(&self.slot);
            guard = self.slot.db.lock();
            if guard.is_none() {
                return self.lock();
            }
        }
        Ok(MutexGuard::map(guard, |db| db.as_mut().expect("open: checked above")))
    }
}

/// What a database about to close (or be handed over) notes.
fn noting(db: &MetaDb) -> EngineResult<Note> {
    Ok(Note { usage: db.usage()?, root: db.inode(ROOT_INO)? })
}

fn delete_detached(db: &mut MetaDb) -> EngineResult<()> {
    for ino in db.detached_inodes()? {
        db.delete_detached(ino)?;
    }
    Ok(())
}

impl Drop for LazyMeta {
    fn drop(&mut self) {
        let db = self.slot.db.lock().take();
        if let Some(db) = db {
            self.slot.close(db);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_budget_the_oldest_idle_database_closes_and_reopens_on_use() {
        let dir = tempfile::tempdir().unwrap();
        let budget = MetaBudget::new(2, 0);
        let metas: Vec<LazyMeta> = (0..3)
            .map(|i| LazyMeta::new(dir.path().join(format!("{i}.sqlite3")), budget.clone(), None, Arc::default(), None))
            .collect();
        let opened = |m: &LazyMeta| m.slot.is_open.load(Ordering::Relaxed);
        drop(metas[0].lock().unwrap());
        drop(metas[1].lock().unwrap());
        assert!(opened(&metas[0]) && opened(&metas[1]));
        // A third closes the oldest; one in use is never closed.
        let busy = metas[1].lock().unwrap();
        drop(metas[2].lock().unwrap());
        assert!(!opened(&metas[0]) && opened(&metas[2]));
        drop(busy);
        assert_eq!(metas[0].lock().unwrap().usage().unwrap().inodes, 0, "reopened on use");
        assert_eq!(budget.open.lock().len(), 2);
    }

    #[test]
    fn a_closed_database_leaves_its_usage_noted_and_an_open_one_none() {
        use crate::engine::meta::NewNode;
        use crate::engine::{FileKind, Owner, ROOT_INO};
        let dir = tempfile::tempdir().unwrap();
        let budget = MetaBudget::new(1, 0);
        // One directory per scope, as in a data directory.
        for d in ["a", "b"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        let path = dir.path().join("a/meta.sqlite3");
        let meta = LazyMeta::new(path.clone(), budget.clone(), None, Arc::default(), None);
        let other = LazyMeta::new(dir.path().join("b/meta.sqlite3"), budget, None, Arc::default(), None);
        assert!(meta.noted().is_none(), "never opened: nothing noted");
        let node = NewNode::plain(FileKind::File, 0o644);
        meta.lock().unwrap().insert(ROOT_INO, b"f", node, Owner { uid: 0, gid: 0 }, 100).unwrap();
        assert!(meta.noted().is_none(), "open: the database answers");
        drop(other.lock().unwrap()); // the budget of one closes `meta`
        let noted = meta.noted().expect("noted when it closed");
        assert_eq!((noted.usage.files, noted.usage.inodes, noted.root.subdirs), (1, 1, 0));
        drop(meta.lock().unwrap());
        assert!(note::read(&path).is_none(), "an open database leaves no note: it may change");
    }
}
