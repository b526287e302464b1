//! `MetaDb`: every SQL statement of a scope's metadata database (namespace, block lists, refcounts, usage).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension};

use super::error::{EngineError, EngineResult};
use super::paths::WriteMode;
use super::types::{FileKind, Ino, Owner, RenameMode, TimeSet, Usage, ROOT_INO};

pub(crate) mod batch;
pub(crate) mod forked;
mod open;
pub(crate) mod redo;
pub(crate) mod shipped;
pub(crate) mod statements;
use batch::Op;
use rows::{inode_cols, link_cols, row_to_inode};
use statements as st;
mod blocks;
mod check;
mod links;
mod page;
mod rows;
mod tree;
mod xattr;

pub(crate) use batch::BATCH_AGE;
use blocks::{add_ref, drop_ref, stage_inline};
pub(crate) use blocks::{FileVersion, StoredBlock, Unreferenced};
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
    /// After the other changes, take away the bits an unprivileged write, truncate or chown takes
    /// (`privs.rs`; a directory keeps them).
    pub kill_suidgid: bool,
}

/// Runs one writing statement of a mutation (one of `statements.rs`) through the connection's
/// statement cache (the hot paths run the same few statements for every file, so each is prepared
/// once per connection); it is recorded with the mutation in the redo log (`batch.rs`).
pub(crate) fn exec(op: &Op<'_>, stmt: st::Stmt, params: &[&dyn rusqlite::ToSql]) -> rusqlite::Result<usize> {
    op.write(&stmt, params)
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

/// The metadata database of one scope. Callers serialize access (one `Mutex`). Mutations commit in
/// batches and are logged in between (`batch.rs`, `redo.rs`); opening replays the log (`open.rs`).
pub(crate) struct MetaDb {
    conn: Connection,
    redo: redo::Redo,
    /// Answers of requests, for requests a restarted server is handed again (`requests.rs`).
    answers: std::sync::Arc<crate::engine::requests::Answers>,
    /// The database lacks acknowledged mutations it could not put back from the log yet.
    poisoned: bool,
    /// Places of directories met by `place` (creates ask for their parent's on every call);
    /// emptied by every rename and rmdir, bounded by `tree::PLACES_KEPT`.
    places: std::cell::RefCell<std::collections::HashMap<Ino, tree::Place>>,
    /// Migrations ran at this open (the shipped chain does not know the schema it is at now).
    migrated: bool,
}

impl MetaDb {
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
            st::INSERT_INODE,
            params![parent as i64, name, kind.as_str(), perm & 0o7777, uid, gid, size, now, target, rdev],
        )?;
        let ino = tx.last_insert_rowid() as Ino;
        tx.set_answer(ino);
        let is_file = i64::from(kind == FileKind::File);
        // A symlink's target is charged to the byte quota (its `size` is the target's length).
        exec(&tx, st::USAGE_INSERTED, params![is_file, size])?;
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
        exec(&tx, st::INSERT_DETACHED, params![perm & 0o7777, uid, gid, now])?;
        let ino = tx.last_insert_rowid() as Ino;
        tx.set_answer(ino);
        exec(&tx, st::USAGE_DETACHED_INSERTED, params![])?;
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
        exec(&tx, st::SET_NLINK_ONE, params![ino as i64])?;
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
        if ch.kill_suidgid && row.kind != FileKind::Dir {
            row.perm = super::privs::without_privs(row.perm);
        }
        if let Some(t) = ch.atime {
            row.atime_ns = resolve(t);
        }
        if let Some(t) = ch.mtime {
            row.mtime_ns = resolve(t);
        }
        row.ctime_ns = now;
        exec(
            &tx,
            st::SET_ATTRS,
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
    /// that are new to the scope (to be uploaded from staging) and the version's number.
    pub fn commit_file(
        &mut self,
        version: &FileVersion<'_>,
        inline: &BTreeMap<String, Vec<u8>>,
    ) -> EngineResult<(Vec<String>, u64)> {
        // NORMAL like every other commit: it survives a killed daemon at once and power loss from
        // the next durability point on (`make_durable`, reached by fsync/fsyncdir/sync).
        let FileVersion { ino, size, mtime_ns, blocks, content_sha256 } = *version;
        let key_epoch = self.key_epoch();
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
            if add_ref(&tx, b, key_epoch)? {
                if let Some(data) = inline.get(&b.sha256) {
                    stage_inline(&tx, &b.sha256, data)?;
                }
                new_shas.push(b.sha256.clone());
            }
            exec(&tx, st::PUT_FILE_BLOCK, params![ino as i64, *idx as i64, b.sha256, b.len as i64])?;
        }
        for (idx, b) in &old {
            if blocks.get(idx) == Some(b) {
                continue;
            }
            drop_ref(&tx, &b.sha256)?;
            if !blocks.contains_key(idx) {
                exec(&tx, st::DELETE_FILE_BLOCK, params![ino as i64, *idx as i64])?;
            }
        }
        let now = now_ns();
        exec(&tx, st::SET_VERSION, params![ino as i64, size as i64, mtime_ns, now, content_sha256])?;
        exec(&tx, st::USAGE_BYTES, params![size as i64 - row.size as i64])?;
        tx.commit()?;
        Ok((new_shas, row.version + 1))
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

    /// Deletes an inode that has no name any more (after its last release, or an orphan at startup);
    /// whether it did (an inode that is gone or has a name is left alone).
    pub fn delete_detached(&mut self, ino: Ino) -> EngineResult<bool> {
        let tx = self.tx()?;
        let mut deleted = false;
        if let Some(row) = inode_in(&tx, ino)? {
            if row.nlink == 0 && row.parent.is_none() && ino != ROOT_INO {
                delete_inode(&tx, &row)?;
                deleted = true;
            }
        }
        tx.commit()?;
        Ok(deleted)
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
    exec(conn, st::TOUCH_DIR, params![ino as i64, now])?;
    Ok(())
}

fn set_name(conn: &Op<'_>, ino: Ino, parent: Ino, name: &[u8], now: i64) -> rusqlite::Result<()> {
    exec(conn, st::SET_NAME, params![ino as i64, parent as i64, name, now])?;
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
        exec(conn, st::DETACH, params![row.ino as i64, now])?;
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
    exec(conn, st::DELETE_FILE_BLOCKS, params![row.ino as i64])?;
    for sha in shas {
        drop_ref(conn, &sha)?;
    }
    // Foreign keys are off (`MetaDb::open`): what the inode owns goes explicitly. It has no
    // further names (it is losing its last one), only extended attributes may remain.
    if has_xattrs(conn, row.ino)? {
        exec(conn, st::DELETE_XATTRS, params![row.ino as i64])?;
    }
    exec(conn, st::DELETE_INODE, params![row.ino as i64])?;
    let (files, bytes) = match row.kind {
        FileKind::File => (1, row.size as i64),
        FileKind::Symlink => (0, row.size as i64),
        _ => (0, 0),
    };
    exec(conn, st::USAGE_DELETED, params![files, bytes])?;
    Ok(())
}
