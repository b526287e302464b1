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
        let tx = self.tx()?;
        let inserted = exec(&tx, st::INSERT_UNREFERENCED_UPLOAD, params![sha, len as i64, now_unix])? > 0;
        tx.commit()?;
        Ok(inserted)
    }

    /// The bytes of a block journaled inline, while it is (until its upload is recorded).
    pub fn inline_block(&self, sha: &str) -> EngineResult<Option<Vec<u8>>> {
        let data = query_one(&self.conn, "SELECT data FROM staged_inline WHERE sha256 = ?1", [sha], |r| r.get(0))
            .optional()?;
        Ok(data)
    }

    /// Every block journaled inline: hash and length.
    pub fn inline_blocks(&self) -> EngineResult<Vec<(String, u64)>> {
        let mut st = self.conn.prepare("SELECT sha256, length(data) FROM staged_inline")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Every block row: hash, length, state uploaded?
    pub fn all_blocks(&self) -> EngineResult<Vec<(String, u64, bool)>> {
        let mut st = self.conn.prepare("SELECT sha256, len, state = 'uploaded' FROM blocks")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64, r.get(2)?)))?;
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
            "SELECT sha256, len, state = 'uploaded', home FROM blocks
             WHERE refcount = 0 AND unreferenced_since <= ?1 AND sha256 > ?2 ORDER BY sha256 LIMIT ?3",
        )?;
        let rows = st.query_map(params![cutoff_unix, after, limit as i64], |r| {
            Ok(Unreferenced {
                sha256: r.get(0)?,
                len: r.get::<_, i64>(1)? as u64,
                uploaded: r.get(2)?,
                inline: false,
                home: r.get(3)?,
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
                exec(&tx, st::INSERT_GC_DELETING, params![&b.sha256])?;
            }
            taken.push(b);
        }
        tx.commit()?;
        *blocks = taken;
        Ok(())
    }

    /// Up to `limit` blocks of the deletion log (`gc_deleting`), each with whether the scope has a
    /// row for it again.
    pub fn gc_deleting(&self, limit: usize) -> EngineResult<Vec<(String, bool)>> {
        let mut st = self.conn.prepare(
            "SELECT d.sha256, EXISTS (SELECT 1 FROM blocks b WHERE b.sha256 = d.sha256) FROM gc_deleting d
             ORDER BY d.sha256 LIMIT ?1",
        )?;
        let rows = st.query_map([limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Removes `shas` from the deletion log (their objects are gone, or belong to a new row).
    pub fn forget_gc_deleting(&mut self, shas: &[String]) -> EngineResult<()> {
        if shas.is_empty() {
            return Ok(());
        }
        let tx = self.tx()?;
        for sha in shas {
            exec(&tx, st::DELETE_GC_DELETING, params![sha])?;
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
}

/// Journals the bytes of a block new to the scope inline, in the caller's transaction.
pub(super) fn stage_inline(conn: &Op<'_>, sha: &str, data: &[u8]) -> rusqlite::Result<()> {
    exec(conn, st::STAGE_INLINE, params![sha, data])?;
    Ok(())
}

/// Adds a reference to a block; returns true when the block is new to the scope (must be uploaded).
pub(super) fn add_ref(conn: &Op<'_>, b: &BlockRef) -> rusqlite::Result<bool> {
    let updated = exec(conn, st::ADD_REF, params![&b.sha256])?;
    if updated == 1 {
        return Ok(false);
    }
    exec(conn, st::INSERT_BLOCK, params![b.sha256, b.len as i64])?;
    Ok(true)
}

pub(super) fn drop_ref(conn: &Op<'_>, sha: &str) -> rusqlite::Result<()> {
    let unix_now = now_ns() / 1_000_000_000;
    exec(conn, st::DROP_REF, params![sha, unix_now])?;
    Ok(())
}
