-- Fenced block keys (issue 23, found by reading the fencing against gc): with several nodes a
-- block new to a scope is stored under a key of the owner's fencing epoch
-- (`scopes/<id>/blocks/<sha>.e<epoch>`; 0, one node: `scopes/<id>/blocks/<sha>`). A deposed owner
-- may still delete what its own state held unreferenced; the new owner never stores under those
-- keys again (an unreferenced row of an earlier epoch is retired, not reused), so such a late
-- delete never takes a block the scope's state refers to.
ALTER TABLE blocks ADD COLUMN key_epoch INTEGER NOT NULL DEFAULT 0;

-- gc's deletion log names the key: the block and the epoch it was stored under.
CREATE TABLE gc_deleting_keys (
    sha256 TEXT NOT NULL,
    key_epoch INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sha256, key_epoch)
) WITHOUT ROWID;
INSERT INTO gc_deleting_keys (sha256) SELECT sha256 FROM gc_deleting;
DROP TABLE gc_deleting;
ALTER TABLE gc_deleting_keys RENAME TO gc_deleting;
