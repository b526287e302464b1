-- Forks and snapshots (issue 23): a block a scope shares with the scope it was forked from lives
-- under that scope's prefix in the object store (`home`, its scope id); NULL: under this scope's
-- own. A fork copies its parent's metadata (O(metadata)) and no block; the registry records which
-- scope holds which block of another (`block_holds`), so gc and purge delete a shared block only
-- when no scope refers to it.
ALTER TABLE blocks ADD COLUMN home TEXT;
CREATE INDEX blocks_by_home ON blocks (home) WHERE home IS NOT NULL;
