-- Online gc's deletion log (issue 24 item 7; found by the crash-state enumeration): the blocks
-- whose rows a gc pass deleted and whose stored objects it has not deleted yet. Written in the
-- same transaction as the rows' deletion (durable before any object goes), emptied as the objects
-- go; a crash in between leaves the list, and the next pass deletes what it names (unless the
-- scope has a row for that block again: then the object is the new row's).
CREATE TABLE gc_deleting (
    sha256 TEXT PRIMARY KEY
) WITHOUT ROWID;

-- The blocks waiting for upload, found without a scan: with metadata shipping every durability
-- point uploads them all first (`ScopeEngine::upload_for_shipping`).
CREATE INDEX blocks_staged ON blocks (sha256) WHERE state = 'staged';
