//! Reads of one committed block wherever its bytes are: the inline journal, staging (a journal
//! file an earlier process left is hashed first), the cache, a local object directory in place,
//! or the object store (under the prefix of the scope it is shared with, for a fork).

use std::fs::File;
use std::os::unix::fs::FileExt;

use sha2::{Digest, Sha256};

use super::super::error::{EngineError, EngineResult};
use super::super::meta::BlockRef;
use super::super::scope::ScopeEngine;

impl ScopeEngine {
    /// Appends `len` bytes of a committed block from `offset` to `out` (zeros past the block's end).
    pub(super) fn read_block_range(&self, b: &BlockRef, offset: u64, len: u64, out: &mut Vec<u8>) -> EngineResult<()> {
        let start = out.len();
        out.resize(start + len as usize, 0);
        let avail = b.len.saturating_sub(offset).min(len) as usize;
        if avail == 0 {
            return Ok(());
        }
        let buf = &mut out[start..start + avail];
        if self.read_inline(&b.sha256, offset, buf, true)? {
            return Ok(());
        }
        let scope = self.scope_id.as_str();
        let cache = &self.storage.cache;
        let staged = self.blocks_dir.join(&b.sha256);
        if let Ok(f) = File::open(&staged) {
            if self.staged_is_whole(&b.sha256, &f)? {
                f.read_exact_at(buf, offset)?;
                return Ok(());
            }
        }
        let own_key = crate::store::block_key_at(scope, self.key_epoch(), &b.sha256);
        if cache.read_at(scope, &b.sha256, offset, buf) || self.storage.read_local_range(&own_key, offset, buf)? {
            return Ok(());
        }
        if self.read_inline(&b.sha256, offset, buf, false)? {
            return Ok(());
        }
        // A block shared with the scope this one was forked from lives under that scope's prefix; one
        // an earlier owner stored, under the key of its epoch.
        let (home, epoch) = self.place_of(&b.sha256)?;
        let key = crate::store::block_key_at(&home, epoch, &b.sha256);
        if (home != scope && cache.read_at(&home, &b.sha256, offset, buf))
            || (key != own_key && self.storage.read_local_range(&key, offset, buf)?)
        {
            return Ok(());
        }
        let data = self.storage.fetch_block(&home, &key, &self.shares.fetch, &b.sha256)?;
        if (data.len() as u64) < offset + avail as u64 {
            return Err(EngineError::Corrupt { sha256: b.sha256.clone() });
        }
        buf.copy_from_slice(&data[offset as usize..offset as usize + avail]);
        Ok(())
    }

    /// Whether a staged block's file holds the block: always for blocks this process staged; one an
    /// earlier process left is hashed once (a power loss may have kept its name but not its bytes).
    /// A damaged one is read from elsewhere (cache, store) or answers `Corrupt`, never wrong bytes.
    fn staged_is_whole(&self, sha: &str, f: &File) -> EngineResult<bool> {
        if !self.unverified_staged.lock().contains(sha) {
            return Ok(true);
        }
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut &*f, &mut data)?;
        if hex::encode(Sha256::digest(&data)) != sha {
            tracing::warn!(scope = %self.scope_id, "a staged block left by an earlier process is damaged");
            return Ok(false);
        }
        self.unverified_staged.lock().remove(sha);
        Ok(true)
    }

    /// Reads a whole committed block (for read-modify-write of a partially overwritten block).
    pub(crate) fn read_block(&self, b: &BlockRef) -> EngineResult<Vec<u8>> {
        let mut out = Vec::with_capacity(b.len as usize);
        self.read_block_range(b, 0, b.len, &mut out)?;
        Ok(out)
    }
}
