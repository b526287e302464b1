//! `MetaDb`: every SQL statement of a scope's metadata database (namespace, block lists, refcounts, usage).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension};

use super::error::{EngineError, EngineResult};
use super::paths::WriteMode;
use super::types::{FileKind, Ino, Owner, RenameMode, TimeSet, Usage, ROOT_INO};
use crate::migrate;

pub(crate) mod batch;
use batch::Op;
use rows::{inode_cols, link_cols, row_to_inode};
mod blocks;
mod check;
mod links;
mod page;
mod rows;
mod tree;
mod xattr;

pub(crate) use batch::BATCH_AGE;
pub(crate) use blocks::FileVersion;
use blocks::{add_ref, drop_ref, stage_inline};
pub(crate) use links::LinkBounds;
use links::{drop_entry, move_aside, set_entry_name};
pub(crate) use page::cursor_of;
pub(crate) use tree::Place;
pub(crate) use xattr::XattrBounds;

/// A block of a file version: its content hash and length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockRef {
    pub sha256: String,
    pub len: u64,
}

/// What a new inode is: its kind, permission bits, a symlink's target, a device node's number.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewNode<'a> {
    pub kind: FileKind,
    pub perm: u32,
    pub target: Option<&'a [u8]>,
    pub rdev: u32,
}

impl NewNode<'_> {
    pub fn plain(kind: FileKind, perm: u32) -> Self {
        NewNode { kind, perm, target: None, rdev: 0 }
    }
}

/// One row of `inodes`.
#[derive(Debug, Clone)]
pub(crate) struct InodeRow {
    pub ino: Ino,
    pub parent: Option<Ino>,
    pub name: Option<Vec<u8>>,
    pub kind: FileKind,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub symlink_target: Option<Vec<u8>>,
    pub version: u64,
    /// Names of a non-directory (0: unlinked while open).
    pub nlink: u32,
    /// Device number of a device node.
    pub rdev: u32,
    /// The `links` row this row was found through (`None`: the inode's first name, or by number).
    pub link: Option<i64>,
    /// Subdirectories of a directory (its link count is 2 + this), kept by the database's triggers.
    pub subdirs: u64,
}

/// What a namespace change did to an inode that lost its last name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// Nothing lost a name.
    None,
    /// The inode was deleted with its blocks.
    Deleted(Ino),
    /// The inode is still open: it lives on without a name until released.
    Detached(Ino),
}

/// Attribute changes applied by `set_attrs`.
#[derive(Debug, Clone, Default)]
pub(crate) struct AttrChanges {
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

/// Runs one writing statement of a mutation through the connection's statement cache (the hot
/// paths run the same few statements for every file, so each is prepared once per connection); it
/// is recorded with the mutation in the redo log (`batch.rs`).
pub(crate) fn exec(op: &Op<'_>, sql: &str, params: &[&dyn rusqlite::ToSql]) -> rusqlite::Result<usize> {
    op.write(sql, params)
}

/// Runs a statement without parameters that belongs to no mutation (the durability
/// commit), through the statement cache.
pub(crate) fn exec_raw(conn: &Connection, sql: &str) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute([])
}

/// One row of one statement, through the connection's statement cache.
pub(crate) fn query_one<T, P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
    f: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.prepare_cached(sql)?.query_row(params, f)
}

pub(crate) fn now_ns() -> i64 {
    to_ns(SystemTime::now())
}

pub(crate) fn to_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

pub(crate) fn from_ns(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// WAL pages written between automatic checkpoints (4 KiB pages: 32 MiB).
const WAL_CHECKPOINT_PAGES: i64 = 8192;
/// Bytes of WAL file kept after a checkpoint resets it.
const WAL_KEEP_BYTES: i64 = 4 << 20;

/// The metadata database of one scope. Callers serialize access (one `Mutex`). Mutations commit in
/// batches and are logged in between (`batch.rs`).
pub(crate) struct MetaDb {
    conn: Connection,
    redo: batch::Redo,
    /// Places of directories met by `place` (creates ask for their parent's on every call);
    /// emptied by every rename and rmdir, bounded by `tree::PLACES_KEPT`.
    places: std::cell::RefCell<std::collections::HashMap<Ino, tree::Place>>,
}

impl MetaDb {
    /// Opens (creating and migrating) the database; creates the root directory on first open.
    pub fn open(path: &Path, root_uid: u32, root_gid: u32) -> EngineResult<MetaDb> {
        let fresh = !path.exists();
        let mut conn = Connection::open(path)?;
        if fresh {
            // Private before the WAL file exists: SQLite gives it the database's mode.
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        }
        batch::persist_wal(&conn)?;
        // One batch, parsed once (a scope's database is opened again whenever the open-database
        // budget closed it):
        // - EXCLUSIVE: one process owns a scope's database while it has it open (its redo log is
        //   replayed under that ownership); another process asking waits (busy timeout), then fails.
        // - NORMAL: in WAL mode a commit survives a process crash; a power loss may drop the newest
        //   commits but never corrupts. Durability points (fsync, fsyncdir, sync) flush the WAL
        //   through one FULL-synchronous commit (`make_durable`), covering every commit before it.
        // - a page cache of up to 4 MiB, so a batch's changed pages fit and are written to the WAL
        //   once, at its commit (a smaller cache spills them mid-batch, some twice); allocated as
        //   used, and all caches together stay within `metadata_cache_max_bytes` (`MetaBudget`).
        // - temp_store MEMORY: statement journals and temporary tables stay in memory, never in a
        //   temporary file.
        // - a checkpoint (three disk flushes under the metadata lock) every 8192 pages, not SQLite's
        //   1000; the WAL is cut back to 4 MiB after a checkpoint and emptied when the database closes.
        // - foreign keys on while a log is replayed (a log of an older daemon relied on their
        //   cascades), off afterwards: every mutation deletes what an inode owns itself
        //   (`delete_inode`), and the cascade programs cost most of an unlink; `consistency_problems`
        //   checks the references.
        conn.execute_batch(&format!(
            "PRAGMA locking_mode = EXCLUSIVE; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
             PRAGMA cache_size = -4096; PRAGMA temp_store = MEMORY;
             PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}; PRAGMA journal_size_limit = {WAL_KEEP_BYTES};
             PRAGMA foreign_keys = ON;"
        ))?;
        conn.busy_timeout(Duration::from_secs(30))?;
        // Every statement of the hot paths stays prepared (`exec`, `prepare_cached`), and keeps its
        // plan: without the query planner stability guarantee SQLite re-prepares a cached statement
        // whenever a bound value (a `LIMIT`, a parent of 0 or 1) might change the plan (15-24 % of
        // the daemon's time in the small-file workloads).
        conn.set_prepared_statement_cache_capacity(64);
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        // A log left by a killed daemon is replayed before any migration: its statements were
        // written for the schema the file has now.
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        let replayed = if version >= batch::REDO_SCHEMA { Some(MetaDb::open_redo(&conn, path)?) } else { None };
        if migrate::SCOPE_META.last().is_some_and(|m| m.version != version) {
            // Off while migrating: a migration that rebuilds a table must not cascade its drop.
            conn.pragma_update(None, "foreign_keys", "OFF")?;
            migrate::apply(&mut conn, migrate::SCOPE_META)?;
        }
        // Only a new database writes here: a reopened one (first use after a restart, or after the
        // open-database budget closed it) stays read-only until used.
        let has_root: bool =
            conn.query_row("SELECT EXISTS (SELECT 1 FROM inodes WHERE ino = ?1)", [ROOT_INO as i64], |r| r.get(0))?;
        if !has_root {
            let now = now_ns();
            conn.execute(
                "INSERT OR IGNORE INTO inodes (ino, parent, name, kind, perm, uid, gid, atime_ns, mtime_ns, ctime_ns)
                 VALUES (?1, NULL, NULL, 'dir', 493, ?2, ?3, ?4, ?4, ?4)",
                params![ROOT_INO as i64, root_uid, root_gid, now],
            )?;
        }
        let redo = match replayed {
            Some(redo) => redo,
            None => {
                conn.pragma_update(None, "foreign_keys", "ON")?;
                MetaDb::open_redo(&conn, path)?
            }
        };
        conn.pragma_update(None, "foreign_keys", "OFF")?;
        Ok(MetaDb { conn, redo, places: Default::default() })
    }

    pub fn inode(&self, ino: Ino) -> EngineResult<InodeRow> {
        inode_in(&self.conn, ino)?.ok_or(EngineError::NotFound)
    }

    pub fn lookup(&self, parent: Ino, name: &[u8]) -> EngineResult<InodeRow> {
        lookup_in(&self.conn, parent, name)?.ok_or(EngineError::NotFound)
    }

    /// Every name in `parent` (first names and further links), by name.
    pub fn children(&self, parent: Ino) -> EngineResult<Vec<InodeRow>> {
        let mut st = self.conn.prepare_cached(concat!(
            "SELECT ",
            inode_cols!(),
            " FROM inodes WHERE parent = ?1 UNION ALL SELECT ",
            link_cols!(),
            " FROM links l JOIN inodes i ON i.ino = l.ino WHERE l.parent = ?1 ORDER BY 3"
        ))?;
        let rows = st.query_map([parent as i64], row_to_inode)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    pub fn usage(&self) -> EngineResult<Usage> {
        Ok(usage_in(&self.conn)?)
    }

    /// Inserts a new inode under `parent`; checks the inode quota and updates the parent's times.
    pub fn insert(
        &mut self,
        parent: Ino,
        name: &[u8],
        node: NewNode<'_>,
        owner: Owner,
        max_inodes: u64,
    ) -> EngineResult<InodeRow> {
        let NewNode { kind, perm, target, rdev } = node;
        let Owner { uid, gid } = owner;
        let tx = self.tx()?;
        let parent_row = inode_in(&tx, parent)?.ok_or(EngineError::NotFound)?;
        if parent_row.kind != FileKind::Dir || parent_row.parent.is_none() && parent != ROOT_INO {
            return Err(if parent_row.kind != FileKind::Dir { EngineError::NotDir } else { EngineError::NotFound });
        }
        if lookup_in(&tx, parent, name)?.is_some() {
            return Err(EngineError::Exists);
        }
        let usage = usage_in(&tx)?;
        if usage.inodes + usage.links >= max_inodes {
            crate::limits::refuse(crate::limits::Bound::QuotaInodes);
            return Err(EngineError::QuotaExceeded("inodes"));
        }
        let now = now_ns();
        let size = target.map(|t| t.len() as i64).unwrap_or(0);
        exec(
            &tx,
            "INSERT INTO inodes (parent, name, kind, perm, uid, gid, size, atime_ns, mtime_ns, ctime_ns, symlink_target, rdev)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?8, ?9, ?10)",
            params![parent as i64, name, kind.as_str(), perm & 0o7777, uid, gid, size, now, target, rdev],
        )?;
        let ino = tx.last_insert_rowid() as Ino;
        let is_file = i64::from(kind == FileKind::File);
        // A symlink's target is charged to the byte quota (its `size` is the target's length).
        exec(
            &tx,
            "UPDATE usage SET inodes = inodes + 1, files = files + ?1, bytes = bytes + ?2 WHERE id = 1",
            params![is_file, size],
        )?;
        touch_dir(&tx, parent, now)?;
        tx.commit()?;
        // The row as inserted (the columns not named above keep their defaults).
        Ok(InodeRow {
            ino,
            parent: Some(parent),
            name: Some(name.to_vec()),
            kind,
            perm: perm & 0o7777,
            uid,
            gid,
            size: size as u64,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            symlink_target: target.map(<[u8]>::to_vec),
            version: 0,
            nlink: 1,
            rdev,
            link: None,
            subdirs: 0,
        })
    }

    /// Inserts a regular file without a name (to be linked by `attach`); checks the inode quota.
    pub fn insert_detached(&mut self, perm: u32, uid: u32, gid: u32, max_inodes: u64) -> EngineResult<InodeRow> {
        let tx = self.tx()?;
        let usage = usage_in(&tx)?;
        if usage.inodes + usage.links >= max_inodes {
            crate::limits::refuse(crate::limits::Bound::QuotaInodes);
            return Err(EngineError::QuotaExceeded("inodes"));
        }
        let now = now_ns();
        exec(
            &tx,
            "INSERT INTO inodes (parent, name, kind, perm, uid, gid, atime_ns, mtime_ns, ctime_ns, nlink)
             VALUES (NULL, NULL, 'file', ?1, ?2, ?3, ?4, ?4, ?4, 0)",
            params![perm & 0o7777, uid, gid, now],
        )?;
        let ino = tx.last_insert_rowid() as Ino;
        exec(&tx, "UPDATE usage SET inodes = inodes + 1, files = files + 1 WHERE id = 1", params![])?;
        let row = inode_in(&tx, ino)?.ok_or(EngineError::NotFound)?;
        tx.commit()?;
        Ok(row)
    }

    /// Gives a detached file the name `parent/name`; an existing non-directory there is replaced when
    /// `replace`, else `Exists`.
    pub fn attach(
        &mut self,
        ino: Ino,
        parent: Ino,
        name: &[u8],
        mode: WriteMode,
        is_open: &dyn Fn(Ino) -> bool,
    ) -> EngineResult<Dropped> {
        let tx = self.tx()?;
        let dir = inode_in(&tx, parent)?.ok_or(EngineError::NotFound)?;
        if dir.kind != FileKind::Dir {
            return Err(EngineError::NotDir);
        }
        let now = now_ns();
        let mut dropped = Dropped::None;
        let old = lookup_in(&tx, parent, name)?;
        if let WriteMode::ReplaceIfUnchanged { ino: read_ino, version } = mode {
            if !old.as_ref().is_some_and(|o| o.ino == read_ino && o.version == version) {
                return Err(EngineError::Changed);
            }
        }
        if let Some(old) = old {
            if mode == WriteMode::CreateNew {
                return Err(EngineError::Exists);
            }
            if old.kind == FileKind::Dir {
                return Err(EngineError::IsDir);
            }
            dropped = drop_entry(&tx, &old, is_open(old.ino), now)?;
        }
        exec(&tx, "UPDATE inodes SET nlink = 1 WHERE ino = ?1", params![ino as i64])?;
        set_name(&tx, ino, parent, name, now)?;
        touch_dir(&tx, parent, now)?;
        tx.commit()?;
        Ok(dropped)
    }

    pub fn set_attrs(&mut self, ino: Ino, ch: &AttrChanges) -> EngineResult<InodeRow> {
        let tx = self.tx()?;
        let mut row = inode_in(&tx, ino)?.ok_or(EngineError::NotFound)?;
        let now = now_ns();
        let resolve = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(at) => to_ns(at),
        };
        if let Some(p) = ch.perm {
            row.perm = p & 0o7777;
        }
        if let Some(u) = ch.uid {
            row.uid = u;
        }
        if let Some(g) = ch.gid {
            row.gid = g;
        }
        if let Some(t) = ch.atime {
            row.atime_ns = resolve(t);
        }
        if let Some(t) = ch.mtime {
            row.mtime_ns = resolve(t);
        }
        row.ctime_ns = now;
        exec(&tx,
            "UPDATE inodes SET perm = ?2, uid = ?3, gid = ?4, atime_ns = ?5, mtime_ns = ?6, ctime_ns = ?7 WHERE ino = ?1",
            params![ino as i64, row.perm, row.uid, row.gid, row.atime_ns, row.mtime_ns, row.ctime_ns],
        )?;
        tx.commit()?;
        Ok(row)
    }

    /// The committed block list of a file.
    pub fn blocks_of(&self, ino: Ino) -> EngineResult<BTreeMap<u64, BlockRef>> {
        let mut st = self.conn.prepare_cached("SELECT idx, sha256, len FROM file_blocks WHERE ino = ?1")?;
        let rows = st.query_map([ino as i64], |r| {
            Ok((r.get::<_, i64>(0)? as u64, BlockRef { sha256: r.get(1)?, len: r.get::<_, i64>(2)? as u64 }))
        })?;
        Ok(rows.collect::<Result<BTreeMap<_, _>, _>>()?)
    }

    /// Commits a new version of a file: its full block list, size and mtime, in one transaction,
    /// with the bytes of its new blocks found in `inline` (the inline journal). Returns the hashes
    /// that are new to the scope (to be uploaded from staging).
    pub fn commit_file(
        &mut self,
        version: &FileVersion<'_>,
        inline: &BTreeMap<String, Vec<u8>>,
    ) -> EngineResult<Vec<String>> {
        // NORMAL like every other commit: it survives a killed daemon at once and power loss from
        // the next durability point on (`make_durable`, reached by fsync/fsyncdir/sync).
        let FileVersion { ino, size, mtime_ns, blocks, content_sha256 } = *version;
        let tx = self.tx()?;
        let row = inode_in(&tx, ino)?.ok_or(EngineError::NotFound)?;
        let old = {
            let mut st = tx.prepare_cached("SELECT idx, sha256, len FROM file_blocks WHERE ino = ?1")?;
            let rows = st.query_map([ino as i64], |r| {
                Ok((r.get::<_, i64>(0)? as u64, BlockRef { sha256: r.get(1)?, len: r.get::<_, i64>(2)? as u64 }))
            })?;
            rows.collect::<Result<BTreeMap<_, _>, _>>()?
        };
        let mut new_shas = Vec::new();
        for (idx, b) in blocks {
            if old.get(idx) == Some(b) {
                continue;
            }
            if add_ref(&tx, b)? {
                if let Some(data) = inline.get(&b.sha256) {
                    stage_inline(&tx, &b.sha256, data)?;
                }
                new_shas.push(b.sha256.clone());
            }
            exec(
                &tx,
                "INSERT OR REPLACE INTO file_blocks (ino, idx, sha256, len) VALUES (?1, ?2, ?3, ?4)",
                params![ino as i64, *idx as i64, b.sha256, b.len as i64],
            )?;
        }
        for (idx, b) in &old {
            if blocks.get(idx) == Some(b) {
                continue;
            }
            drop_ref(&tx, &b.sha256)?;
            if !blocks.contains_key(idx) {
                exec(&tx, "DELETE FROM file_blocks WHERE ino = ?1 AND idx = ?2", params![ino as i64, *idx as i64])?;
            }
        }
        let now = now_ns();
        exec(
            &tx,
            "UPDATE inodes SET size = ?2, mtime_ns = ?3, ctime_ns = ?4, version = version + 1, content_sha256 = ?5
             WHERE ino = ?1",
            params![ino as i64, size as i64, mtime_ns, now, content_sha256],
        )?;
        exec(&tx, "UPDATE usage SET bytes = bytes + ?1 WHERE id = 1", params![size as i64 - row.size as i64])?;
        tx.commit()?;
        Ok(new_shas)
    }

    /// Removes the name `parent/name` of a non-directory. `is_open` says whether an inode is still open.
    pub fn unlink(&mut self, parent: Ino, name: &[u8], is_open: &dyn Fn(Ino) -> bool) -> EngineResult<Dropped> {
        let tx = self.tx()?;
        let row = lookup_in(&tx, parent, name)?.ok_or(EngineError::NotFound)?;
        if row.kind == FileKind::Dir {
            return Err(EngineError::IsDir);
        }
        let now = now_ns();
        let dropped = drop_entry(&tx, &row, is_open(row.ino), now)?;
        touch_dir(&tx, parent, now)?;
        tx.commit()?;
        Ok(dropped)
    }

    pub fn rmdir(&mut self, parent: Ino, name: &[u8]) -> EngineResult<()> {
        self.places.get_mut().clear();
        let tx = self.tx()?;
        let row = lookup_in(&tx, parent, name)?.ok_or(EngineError::NotFound)?;
        if row.kind != FileKind::Dir {
            return Err(EngineError::NotDir);
        }
        if has_children(&tx, row.ino)? {
            return Err(EngineError::NotEmpty);
        }
        let now = now_ns();
        drop_entry(&tx, &row, false, now)?;
        touch_dir(&tx, parent, now)?;
        tx.commit()?;
        Ok(())
    }

    /// Renames atomically with `renameat2` semantics.
    pub fn rename(
        &mut self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        mode: RenameMode,
        is_open: &dyn Fn(Ino) -> bool,
    ) -> EngineResult<Dropped> {
        self.places.get_mut().clear();
        let tx = self.tx()?;
        let src = lookup_in(&tx, parent, name)?.ok_or(EngineError::NotFound)?;
        let np = inode_in(&tx, new_parent)?.ok_or(EngineError::NotFound)?;
        if np.kind != FileKind::Dir {
            return Err(EngineError::NotDir);
        }
        let dst = lookup_in(&tx, new_parent, new_name)?;
        let now = now_ns();
        let mut dropped = Dropped::None;
        if src.kind == FileKind::Dir && is_within(&tx, new_parent, src.ino)? {
            return Err(EngineError::Invalid("cannot move a directory into itself"));
        }
        match (mode, &dst) {
            (RenameMode::NoReplace, Some(_)) => return Err(EngineError::Exists),
            (RenameMode::Exchange, None) => return Err(EngineError::NotFound),
            (RenameMode::Exchange, Some(d)) => {
                if d.kind == FileKind::Dir && is_within(&tx, parent, d.ino)? {
                    return Err(EngineError::Invalid("cannot move a directory into itself"));
                }
                // Swap names through a temporary move aside to respect the unique indexes.
                move_aside(&tx, d)?;
                set_entry_name(&tx, &src, new_parent, new_name, now)?;
                set_entry_name(&tx, d, parent, name, now)?;
            }
            (_, Some(d)) if d.ino == src.ino => return Ok(Dropped::None),
            (_, Some(d)) => {
                match (src.kind == FileKind::Dir, d.kind == FileKind::Dir) {
                    (true, false) => return Err(EngineError::NotDir),
                    (false, true) => return Err(EngineError::IsDir),
                    (true, true) if has_children(&tx, d.ino)? => return Err(EngineError::NotEmpty),
                    _ => {}
                }
                dropped = drop_entry(&tx, d, is_open(d.ino), now)?;
                set_entry_name(&tx, &src, new_parent, new_name, now)?;
            }
            (_, None) => set_entry_name(&tx, &src, new_parent, new_name, now)?,
        }
        touch_dir(&tx, parent, now)?;
        if new_parent != parent {
            touch_dir(&tx, new_parent, now)?;
        }
        tx.commit()?;
        Ok(dropped)
    }

    /// Deletes an inode that has no name any more (after its last release, or an orphan at startup).
    pub fn delete_detached(&mut self, ino: Ino) -> EngineResult<()> {
        let tx = self.tx()?;
        if let Some(row) = inode_in(&tx, ino)? {
            if row.nlink == 0 && row.parent.is_none() && ino != ROOT_INO {
                delete_inode(&tx, &row)?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Inodes without a name (unlinked while open when the daemon stopped).
    pub fn detached_inodes(&self) -> EngineResult<Vec<Ino>> {
        let mut st = self.conn.prepare("SELECT ino FROM inodes WHERE parent IS NULL AND ino <> ?1")?;
        let rows = st.query_map([ROOT_INO as i64], |r| r.get::<_, i64>(0))?;
        Ok(rows.map(|r| r.map(|i| i as Ino)).collect::<Result<Vec<_>, _>>()?)
    }
}

fn inode_in(conn: &Connection, ino: Ino) -> rusqlite::Result<Option<InodeRow>> {
    conn.prepare_cached(concat!("SELECT ", inode_cols!(), " FROM inodes WHERE ino = ?1"))?
        .query_row([ino as i64], row_to_inode)
        .optional()
}

/// The inode named `name` in `parent`, through its first name or a further link: one statement
/// (a name is either a first name or a link, never both), which stops at the first row.
fn lookup_in(conn: &Connection, parent: Ino, name: &[u8]) -> rusqlite::Result<Option<InodeRow>> {
    conn.prepare_cached(concat!(
        "SELECT ",
        inode_cols!(),
        " FROM inodes WHERE parent = ?1 AND name = ?2 UNION ALL SELECT ",
        link_cols!(),
        " FROM links l JOIN inodes i ON i.ino = l.ino WHERE l.parent = ?1 AND l.name = ?2 LIMIT 1"
    ))?
    .query_row(params![parent as i64, name], row_to_inode)
    .optional()
}

fn usage_in(conn: &Connection) -> rusqlite::Result<Usage> {
    conn.prepare_cached("SELECT files, bytes, inodes, links FROM usage WHERE id = 1")?.query_row([], |r| {
        Ok(Usage {
            files: r.get::<_, i64>(0)? as u64,
            bytes: r.get::<_, i64>(1)? as u64,
            inodes: r.get::<_, i64>(2)? as u64,
            links: r.get::<_, i64>(3)? as u64,
        })
    })
}

fn has_xattrs(conn: &Connection, ino: Ino) -> rusqlite::Result<bool> {
    conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM xattrs WHERE ino = ?1)")?.query_row([ino as i64], |r| r.get(0))
}

fn has_children(conn: &Connection, ino: Ino) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM inodes WHERE parent = ?1) OR EXISTS (SELECT 1 FROM links WHERE parent = ?1)",
    )?
    .query_row([ino as i64], |r| r.get(0))
}

fn touch_dir(conn: &Op<'_>, ino: Ino, now: i64) -> rusqlite::Result<()> {
    exec(conn, "UPDATE inodes SET mtime_ns = ?2, ctime_ns = ?2 WHERE ino = ?1", params![ino as i64, now])?;
    Ok(())
}

fn set_name(conn: &Op<'_>, ino: Ino, parent: Ino, name: &[u8], now: i64) -> rusqlite::Result<()> {
    exec(
        conn,
        "UPDATE inodes SET parent = ?2, name = ?3, ctime_ns = ?4 WHERE ino = ?1",
        params![ino as i64, parent as i64, name, now],
    )?;
    Ok(())
}

/// Whether `ino` is `ancestor` or lies below it.
fn is_within(conn: &Connection, mut ino: Ino, ancestor: Ino) -> EngineResult<bool> {
    loop {
        if ino == ancestor {
            return Ok(true);
        }
        if ino == ROOT_INO {
            return Ok(false);
        }
        ino = inode_in(conn, ino)?.and_then(|r| r.parent).ok_or(EngineError::NotFound)?;
    }
}

/// Takes the only name of an inode away: detaches it if open, else deletes it.
fn drop_last_name(conn: &Op<'_>, row: &InodeRow, open: bool, now: i64) -> EngineResult<Dropped> {
    if open {
        exec(
            conn,
            "UPDATE inodes SET parent = NULL, name = NULL, nlink = 0, ctime_ns = ?2 WHERE ino = ?1",
            params![row.ino as i64, now],
        )?;
        Ok(Dropped::Detached(row.ino))
    } else {
        delete_inode(conn, row)?;
        Ok(Dropped::Deleted(row.ino))
    }
}

fn delete_inode(conn: &Op<'_>, row: &InodeRow) -> EngineResult<()> {
    let shas = {
        let mut st = conn.prepare_cached("SELECT sha256 FROM file_blocks WHERE ino = ?1")?;
        let rows = st.query_map([row.ino as i64], |r| r.get::<_, String>(0))?;
        rows.collect::<Result<Vec<_>, _>>()?
    };
    exec(conn, "DELETE FROM file_blocks WHERE ino = ?1", params![row.ino as i64])?;
    for sha in shas {
        drop_ref(conn, &sha)?;
    }
    // Foreign keys are off (`MetaDb::open`): what the inode owns goes explicitly. It has no
    // further names (it is losing its last one), only extended attributes may remain.
    if has_xattrs(conn, row.ino)? {
        exec(conn, "DELETE FROM xattrs WHERE ino = ?1", params![row.ino as i64])?;
    }
    exec(conn, "DELETE FROM inodes WHERE ino = ?1", params![row.ino as i64])?;
    let (files, bytes) = match row.kind {
        FileKind::File => (1, row.size as i64),
        FileKind::Symlink => (0, row.size as i64),
        _ => (0, 0),
    };
    exec(
        conn,
        "UPDATE usage SET inodes = inodes - 1, files = files - ?1, bytes = bytes - ?2 WHERE id = 1",
        params![files, bytes],
    )?;
    Ok(())
}
