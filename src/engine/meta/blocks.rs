//! Blocks in the metadata database: reference counts, the upload journal (`staged` rows, with the
//! bytes of small blocks inline in `staged_inline`), and the blocks nobody references any more
//! (collected by gc).

use std::collections::BTreeMap;

use rusqlite::{params, OptionalExtension};

use super::batch::Op;
use super::statements as st;
use super::{exec, now_ns, query_one, BlockRef, MetaDb};
use crate::engine::{EngineResult, Ino};

/// One version of a file as `commit_file` records it.
#[derive(Clone, Copy)]
pub(crate) struct FileVersion<'a> {
    pub ino: Ino,
    pub size: u64,
    pub mtime_ns: i64,
    pub blocks: &'a BTreeMap<u64, BlockRef>,
    pub content_sha256: Option<&'a str>,
}

impl MetaDb {
    /// Hashes of blocks still waiting for upload (the journal).
    pub fn staged_blocks(&self) -> EngineResult<Vec<String>> {
        let mut st = self.conn.prepare("SELECT sha256 FROM blocks WHERE state = 'staged'")?;
        let rows = st.query_map([], |r| r.get::<_, String>(0))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// `Some(true)` uploaded, `Some(false)` staged, `None` unknown.
    pub fn block_uploaded(&self, sha: &str) -> EngineResult<Option<bool>> {
        let st: Option<String> =
            query_one(&self.conn, "SELECT state FROM blocks WHERE sha256 = ?1", [sha], |r| r.get(0)).optional()?;
        Ok(st.map(|s| s == "uploaded"))
    }

    /// Records that the store holds a block, and drops its inline journal bytes in the same
    /// transaction; `true` when it had inline bytes.
    pub fn mark_uploaded(&mut self, sha: &str) -> EngineResult<bool> {
        Ok(self.mark_uploaded_many(&[sha])?.first().copied().unwrap_or(false))
    }

    /// `mark_uploaded` for a group of blocks in one transaction; for each, whether it had inline bytes.
    pub fn mark_uploaded_many(&mut self, shas: &[&str]) -> EngineResult<Vec<bool>> {
        let tx = self.tx()?;
        let mut had = Vec::with_capacity(shas.len());
        for sha in shas {
            exec(&tx, st::MARK_UPLOADED, params![sha])?;
            had.push(exec(&tx, st::DELETE_INLINE, params![sha])? > 0);
        }
        tx.commit()?;
        Ok(had)
    }

    /// Records a block an early upload stored before any file referenced it: uploaded, unreferenced
    /// since `now_unix` (gc collects it unless a commit references it first). `false` when the
    /// scope already had a row for it (left as it was).
    pub fn record_unreferenced_upload(&mut self, sha: &str, len: u64, now_unix: i64) -> EngineResult<bool> {
        let epoch = self.key_epoch();
        let tx = self.tx()?;
        let inserted = match epoch {
            0 => exec(&tx, st::INSERT_UNREFERENCED_UPLOAD, params![sha, len as i64, now_unix])?,
            e => exec(&tx, st::INSERT_UNREFERENCED_UPLOAD_AT, params![sha, len as i64, now_unix, e as i64])?,
        } > 0;
        tx.commit()?;
        Ok(inserted)
    }

    /// The bytes of a block journaled inline, while it is (until its upload is recorded).
    pub fn inline_block(&self, sha: &str) -> EngineResult<Option<Vec<u8>>> {
        let data = query_one(&self.conn, "SELECT data FROM staged_inline WHERE sha256 = ?1", [sha], |r| r.get(0))
            .optional()?;
        Ok(data)
    }

    /// What uploading block `sha` needs, in one query: the epoch of its key (0 without a row) and
    /// its bytes when it is journaled inline.
    pub fn staged_upload(&self, sha: &str) -> EngineResult<(u64, Option<Vec<u8>>)> {
        let sql = "SELECT (SELECT key_epoch FROM blocks WHERE sha256 = ?1), \
                          (SELECT data FROM staged_inline WHERE sha256 = ?1)";
        let (epoch, data) = query_one(&self.conn, sql, [sha], |r| Ok((r.get::<_, Option<i64>>(0)?, r.get(1)?)))?;
        Ok((epoch.unwrap_or(0) as u64, data))
    }

    /// The blocks among `shas` no upload is needed for: journaled inline, never stored, and no
    /// file refers to them (`engine/unneeded.rs`). One query.
    pub fn unneeded_among(&self, shas: &[String]) -> EngineResult<Vec<Unreferenced>> {
        if shas.is_empty() {
            return Ok(Vec::new());
        }
        let marks = vec!["?"; shas.len()].join(",");
        let sql = format!(
            "SELECT b.sha256, b.len, b.key_epoch FROM blocks b JOIN staged_inline i ON i.sha256 = b.sha256 \
             WHERE b.sha256 IN ({marks}) AND b.refcount = 0 AND b.state = 'staged' AND b.home IS NULL"
        );
        let mut st = self.conn.prepare_cached(&sql)?;
        let rows = st.query_map(rusqlite::params_from_iter(shas), |r| {
            Ok(Unreferenced {
                sha256: r.get(0)?,
                len: r.get::<_, i64>(1)? as u64,
                uploaded: false,
                inline: false,
                home: None,
                key_epoch: r.get::<_, i64>(2)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Every block journaled inline: hash and length.
    pub fn inline_blocks(&self) -> EngineResult<Vec<(String, u64)>> {
        let mut st = self.conn.prepare("SELECT sha256, length(data) FROM staged_inline")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Every block row: hash, state uploaded?, and the epoch of its key.
    pub fn all_blocks(&self) -> EngineResult<Vec<(String, bool, u64)>> {
        let mut st = self.conn.prepare("SELECT sha256, state = 'uploaded', key_epoch FROM blocks")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? as u64)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Files (inode numbers) that reference a block.
    pub fn files_with_block(&self, sha: &str) -> EngineResult<Vec<Ino>> {
        let mut st = self.conn.prepare("SELECT DISTINCT ino FROM file_blocks WHERE sha256 = ?1")?;
        let rows = st.query_map([sha], |r| r.get::<_, i64>(0))?;
        Ok(rows.map(|r| r.map(|i| i as Ino)).collect::<Result<Vec<_>, _>>()?)
    }

    /// Up to `limit` blocks no file has referenced since before `cutoff_unix`, after `after` in
    /// hash order (gc's pages).
    pub fn unreferenced(&self, cutoff_unix: i64, after: &str, limit: usize) -> EngineResult<Vec<Unreferenced>> {
        let mut st = self.conn.prepare(
            "SELECT sha256, len, state = 'uploaded', home, key_epoch FROM blocks
             WHERE refcount = 0 AND unreferenced_since <= ?1 AND sha256 > ?2 ORDER BY sha256 LIMIT ?3",
        )?;
        let rows = st.query_map(params![cutoff_unix, after, limit as i64], |r| {
            Ok(Unreferenced {
                sha256: r.get(0)?,
                len: r.get::<_, i64>(1)? as u64,
                uploaded: r.get(2)?,
                inline: false,
                home: r.get(3)?,
                key_epoch: r.get::<_, i64>(4)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Deletes the rows of `blocks` (still unreferenced) and their journaled bytes, in one batch,
    /// logging in `gc_deleting` each whose object this scope's prefix holds (deleted next); marks
    /// which had bytes journaled inline. Those referenced again meanwhile are dropped from it.
    pub fn take_unreferenced(&mut self, blocks: &mut Vec<Unreferenced>) -> EngineResult<()> {
        let tx = self.tx()?;
        let mut taken = Vec::with_capacity(blocks.len());
        for mut b in blocks.drain(..) {
            if exec(&tx, st::DELETE_UNREFERENCED, params![&b.sha256])? == 0 {
                continue;
            }
            b.inline = exec(&tx, st::DELETE_INLINE, params![&b.sha256])? > 0;
            if b.uploaded && b.home.is_none() {
                match b.key_epoch {
                    0 => exec(&tx, st::INSERT_GC_DELETING, params![&b.sha256])?,
                    e => exec(&tx, st::INSERT_GC_DELETING_AT, params![&b.sha256, e as i64])?,
                };
            }
            taken.push(b);
        }
        tx.commit()?;
        *blocks = taken;
        Ok(())
    }

    /// Up to `limit` objects of the deletion log (`gc_deleting`), each with whether the scope has a
    /// row for that object (the same block under the same key) again.
    pub fn gc_deleting(&self, limit: usize) -> EngineResult<Vec<(StoredBlock, bool)>> {
        let mut st = self.conn.prepare(
            "SELECT d.sha256, d.key_epoch,
                    EXISTS (SELECT 1 FROM blocks b WHERE b.sha256 = d.sha256 AND b.key_epoch = d.key_epoch)
             FROM gc_deleting d ORDER BY d.sha256, d.key_epoch LIMIT ?1",
        )?;
        let rows = st.query_map([limit as i64], |r| {
            Ok((StoredBlock { sha256: r.get(0)?, key_epoch: r.get::<_, i64>(1)? as u64 }, r.get(2)?))
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Removes `objects` from the deletion log (they are gone, or belong to a new row).
    pub fn forget_gc_deleting(&mut self, objects: &[StoredBlock]) -> EngineResult<()> {
        if objects.is_empty() {
            return Ok(());
        }
        let tx = self.tx()?;
        for o in objects {
            exec(&tx, st::DELETE_GC_DELETING_AT, params![&o.sha256, o.key_epoch as i64])?;
        }
        tx.commit()?;
        Ok(())
    }
}

/// A block row gc took: no file references it any more.
pub(crate) struct Unreferenced {
    pub sha256: String,
    pub len: u64,
    /// Whether the object store holds it (it must be deleted there too).
    pub uploaded: bool,
    /// Whether its bytes were journaled inline (now deleted with the row).
    pub inline: bool,
    /// The scope whose prefix holds its object when not this one (shared with a fork's parent).
    pub home: Option<String>,
    /// The fencing epoch its object was stored under (`store::block_key_at`).
    pub key_epoch: u64,
}

/// One stored object of a block of this scope's prefix: the block and the epoch of its key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct StoredBlock {
    pub sha256: String,
    pub key_epoch: u64,
}

impl StoredBlock {
    pub fn key(&self, scope: &str) -> String {
        crate::store::block_key_at(scope, self.key_epoch, &self.sha256)
    }
}

/// Journals the bytes of a block new to the scope inline, in the caller's transaction.
pub(super) fn stage_inline(conn: &Op<'_>, sha: &str, data: &[u8]) -> rusqlite::Result<()> {
    exec(conn, st::STAGE_INLINE, params![sha, data])?;
    Ok(())
}

/// Adds a reference to a block; returns true when the block is new to the scope (must be uploaded).
/// With a fence (`epoch` > 0), a row nothing references that an earlier owner stored (or a block
/// shared with another scope) is not reused: a deposed owner may still delete its object. The row
/// is retired (its object into gc's deletion log) and the block stored anew under `epoch`.
pub(super) fn add_ref(conn: &Op<'_>, b: &BlockRef, epoch: u64) -> rusqlite::Result<bool> {
    if epoch == 0 {
        if exec(conn, st::ADD_REF, params![&b.sha256])? == 1 {
            return Ok(false);
        }
        exec(conn, st::INSERT_BLOCK, params![b.sha256, b.len as i64])?;
        return Ok(true);
    }
    if exec(conn, st::ADD_REF_AT, params![&b.sha256, epoch as i64])? == 1 {
        return Ok(false);
    }
    exec(conn, st::RETIRE_UNREFERENCED, params![&b.sha256])?;
    exec(conn, st::DELETE_UNREFERENCED, params![&b.sha256])?;
    exec(conn, st::INSERT_BLOCK_AT, params![b.sha256, b.len as i64, epoch as i64])?;
    Ok(true)
}

pub(super) fn drop_ref(conn: &Op<'_>, sha: &str) -> rusqlite::Result<()> {
    let unix_now = now_ns() / 1_000_000_000;
    exec(conn, st::DROP_REF, params![sha, unix_now])?;
    Ok(())
}
