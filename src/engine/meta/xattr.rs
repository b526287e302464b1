//! Extended attributes in the metadata database: the `xattrs` rows of an inode, their per-inode
//! bounds and their charge to the byte quota (kept in `usage.bytes` by the triggers of migration 0005).

use rusqlite::{params, Connection, OptionalExtension};

use super::statements as st;
use super::{exec, now_ns, MetaDb};
use crate::engine::xattr::XattrMode;
use crate::engine::{EngineError, EngineResult, FileKind, Ino};

/// Per-inode bounds on extended attributes (`limits.max_xattrs_per_inode`, `max_xattr_bytes_per_inode`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct XattrBounds {
    pub max_count: u64,
    pub max_bytes: u64,
}

/// The kind of an inode, `NotFound` when it does not exist.
fn kind_in(conn: &Connection, ino: Ino) -> EngineResult<FileKind> {
    let kind: Option<String> = conn
        .prepare_cached("SELECT kind FROM inodes WHERE ino = ?1")?
        .query_row([ino as i64], |r| r.get(0))
        .optional()?;
    match kind.as_deref() {
        None => Err(EngineError::NotFound),
        Some("file") => Ok(FileKind::File),
        Some("dir") => Ok(FileKind::Dir),
        Some("symlink") => Ok(FileKind::Symlink),
        // Special files (fifos, sockets, device nodes) are alike here: no user attributes.
        Some(_) => Ok(FileKind::Fifo),
    }
}

/// Length of the value stored under `name`, if any.
fn value_len(conn: &Connection, ino: Ino, name: &[u8]) -> rusqlite::Result<Option<u64>> {
    conn.prepare_cached("SELECT length(value) FROM xattrs WHERE ino = ?1 AND name = ?2")?
        .query_row(params![ino as i64, name], |r| r.get::<_, i64>(0))
        .optional()
        .map(|v| v.map(|n| n as u64))
}

impl MetaDb {
    /// The kind of inode `ino` (`NotFound` when it does not exist).
    pub fn xattr_owner_kind(&self, ino: Ino) -> EngineResult<FileKind> {
        kind_in(&self.conn, ino)
    }

    /// The value of attribute `name` of `ino`: `NotFound` without the inode, `NoData` without the attribute.
    pub fn xattr(&self, ino: Ino, name: &[u8]) -> EngineResult<Vec<u8>> {
        kind_in(&self.conn, ino)?;
        let value: Option<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2")?
            .query_row(params![ino as i64, name], |r| r.get(0))
            .optional()?;
        value.ok_or(EngineError::NoData)
    }

    /// Names of the attributes of `ino`, in byte order.
    pub fn xattr_names(&self, ino: Ino) -> EngineResult<Vec<Vec<u8>>> {
        kind_in(&self.conn, ino)?;
        let mut st = self.conn.prepare_cached("SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name")?;
        let rows = st.query_map([ino as i64], |r| r.get::<_, Vec<u8>>(0))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Sets attribute `name` of `ino` to `value` and the inode's ctime to now, in one transaction.
    /// Checked first: `mode` (`Exists`/`NoData`), the per-inode `bounds` (`XattrsFull`) and, for the
    /// bytes the attribute adds, `room(committed_bytes, growth)` (the byte quota).
    pub fn set_xattr(
        &mut self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
        bounds: XattrBounds,
        room: &dyn Fn(u64, u64) -> EngineResult<()>,
    ) -> EngineResult<()> {
        let tx = self.tx()?;
        let kind = kind_in(&tx, ino)?;
        if !matches!(kind, FileKind::File | FileKind::Dir) {
            // Linux: user attributes only on regular files and directories.
            return Err(EngineError::NotPermitted("user extended attributes on a special file or symlink"));
        }
        let old = value_len(&tx, ino, name)?;
        match (mode, old) {
            (XattrMode::Create | XattrMode::CreateAndReplace, Some(_)) => return Err(EngineError::Exists),
            (XattrMode::Replace | XattrMode::CreateAndReplace, None) => return Err(EngineError::NoData),
            _ => {}
        }
        let (count, bytes): (i64, i64) = tx
            .prepare_cached(
                "SELECT COUNT(*), COALESCE(SUM(length(name) + length(value)), 0) FROM xattrs WHERE ino = ?1",
            )?
            .query_row([ino as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let old_bytes = old.map(|v| v + name.len() as u64).unwrap_or(0);
        let new_bytes = (name.len() + value.len()) as u64;
        let count_after = count as u64 + u64::from(old.is_none());
        let bytes_after = (bytes as u64 - old_bytes).saturating_add(new_bytes);
        if count_after > bounds.max_count || bytes_after > bounds.max_bytes {
            crate::limits::refuse(crate::limits::Bound::InodeXattrs);
            return Err(EngineError::XattrsFull);
        }
        if new_bytes > old_bytes {
            let committed: i64 = tx.query_row("SELECT bytes FROM usage WHERE id = 1", [], |r| r.get(0))?;
            room(committed.max(0) as u64, new_bytes - old_bytes)?;
        }
        exec(&tx, st::PUT_XATTR, params![ino as i64, name, value])?;
        exec(&tx, st::SET_CTIME, params![ino as i64, now_ns()])?;
        tx.commit()?;
        Ok(())
    }

    /// Removes attribute `name` of `ino` (`NoData` when absent) and sets the inode's ctime to now.
    pub fn remove_xattr(&mut self, ino: Ino, name: &[u8]) -> EngineResult<()> {
        let tx = self.tx()?;
        let kind = kind_in(&tx, ino)?;
        if !matches!(kind, FileKind::File | FileKind::Dir) {
            return Err(EngineError::NotPermitted("user extended attributes on a special file or symlink"));
        }
        // Checked before the delete: a mutation refused after it wrote costs a replay of its batch.
        if value_len(&tx, ino, name)?.is_none() {
            return Err(EngineError::NoData);
        }
        exec(&tx, st::DELETE_XATTR, params![ino as i64, name])?;
        exec(&tx, st::SET_CTIME, params![ino as i64, now_ns()])?;
        tx.commit()?;
        Ok(())
    }
}
