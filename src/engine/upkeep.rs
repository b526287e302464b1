//! Upkeep of one scope: `fsck` (damaged files, orphan objects, metadata counters) and the metadata
//! self-checks (garbage collection is `gc.rs`).

use super::error::EngineResult;
use super::scope::ScopeEngine;

/// Result of `fsck` of one scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsckReport {
    pub files_checked: u64,
    pub blocks_checked: u64,
    /// Virtual paths of files with a missing or corrupt block.
    pub damaged_files: Vec<String>,
    /// Objects under the scope prefix no block row refers to (nor gc's deletion log).
    pub orphan_objects: Vec<String>,
    /// Objects gc took the rows of and has not deleted yet (its deletion log: a pass cut short);
    /// the next gc pass deletes them.
    pub pending_deletes: Vec<String>,
    /// Metadata inconsistencies (counters, references).
    pub metadata_problems: Vec<String>,
}

impl ScopeEngine {
    /// Verifies that every referenced block exists in the store with the right hash (downloading each),
    /// lists orphan objects, and checks metadata counters. With `repair`, orphan objects are deleted.
    pub fn fsck(&self, repair: bool) -> EngineResult<FsckReport> {
        let scope = self.scope_id.as_str().to_string();
        let mut report = FsckReport::default();
        let (blocks, usage, problems, logged) = {
            let meta = self.meta.lock()?;
            (meta.all_blocks()?, meta.usage()?, meta.consistency_problems()?, meta.gc_deleting(usize::MAX)?)
        };
        let logged: Vec<_> = logged.into_iter().filter(|(_, has_row)| !has_row).map(|(o, _)| o).collect();
        let logged_keys: std::collections::HashSet<String> = logged.iter().map(|o| o.key(&scope)).collect();
        report.metadata_problems = problems;
        report.files_checked = usage.files;
        let st = &self.storage;
        let mut damaged_inos = std::collections::BTreeSet::new();
        for (sha, uploaded, _) in &blocks {
            report.blocks_checked += 1;
            let mut ok = if *uploaded { self.stored_intact(sha)? } else { self.staged_present(sha) };
            if !ok && !*uploaded {
                // Gone from staging: uploaded while fsck ran, or uploaded before a crash lost the
                // mark (the uploader marks it when it sees the object). Damaged only if the store
                // lacks it too.
                ok = self.stored_intact(sha)?;
            }
            if !ok {
                st.cache.remove(&scope, sha);
                damaged_inos.extend(self.meta.lock()?.files_with_block(sha)?);
            }
        }
        for ino in damaged_inos {
            let path = self.path_of(ino)?.unwrap_or_else(|| format!("(unlinked inode {ino})"));
            report.damaged_files.push(path);
        }
        let known: std::collections::HashSet<String> =
            blocks.iter().map(|(sha, _, epoch)| crate::store::block_key_at(&scope, *epoch, sha)).collect();
        let prefix = format!("{}blocks/", crate::store::scope_prefix(&scope));
        let listed = st.rt.block_on(st.with_retry(st.settings.store_attempts, || st.store.list(&prefix)))?;
        for obj in listed {
            if !known.contains(&obj.key) {
                if repair {
                    st.rt.block_on(st.with_retry(st.settings.store_attempts, || st.store.delete(&obj.key)))?;
                }
                if logged_keys.contains(&obj.key) {
                    report.pending_deletes.push(obj.key);
                } else {
                    report.orphan_objects.push(obj.key);
                }
            }
        }
        if repair {
            self.meta.lock()?.forget_gc_deleting(&logged)?;
        }
        Ok(report)
    }

    /// Whether the store holds block `sha` with its bytes intact (downloading it), under this
    /// scope's prefix or the one it shares the block with.
    fn stored_intact(&self, sha: &str) -> EngineResult<bool> {
        let st = &self.storage;
        let key = self.key_of(sha)?;
        let _room = st.fetch_room(&self.shares.fetch)?;
        match st.rt.block_on(st.with_retry(st.settings.store_attempts, || st.store.get(&key))) {
            Ok(data) => {
                use sha2::Digest;
                Ok(hex::encode(sha2::Sha256::digest(&data)) == sha)
            }
            Err(crate::store::StoreError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether a staged block's bytes are in the journal (inline or a journal file).
    fn staged_present(&self, sha: &str) -> bool {
        self.is_inline(sha) || self.blocks_dir.join(sha).exists()
    }

    /// Commits the scope's open batch of metadata mutations and checkpoints the database's WAL into
    /// its file; `true` when all of it was copied.
    pub fn checkpoint_metadata(&self) -> EngineResult<bool> {
        self.meta.lock()?.checkpoint()
    }

    /// Writes a consistent copy of the scope's metadata database (every mutation so far) to `to`,
    /// while the scope is in use: another process cannot open a database this one has open.
    pub fn copy_metadata_to(&self, to: &std::path::Path) -> EngineResult<()> {
        self.meta.lock()?.copy_to(to)
    }

    /// `PRAGMA integrity_check` of the scope's metadata database ("ok" when healthy).
    pub fn integrity_check(&self) -> EngineResult<String> {
        self.meta.lock()?.integrity_check()
    }

    /// Counter and reference mismatches in the metadata (empty when consistent).
    pub fn consistency_problems(&self) -> EngineResult<Vec<String>> {
        self.meta.lock()?.consistency_problems()
    }
}
