-- The redo log's second format (issue 21): each generation of `meta.sqlite3-redo` names the
-- committed state it builds on, and a replay runs it only onto exactly that state. `state` is that
-- state's random id (every batch commit sets a new one); `answered` holds the answers of requests
-- whose mutations committed but that were not answered yet (request id and answer, 16 bytes each),
-- so a request the kernel resends to the next process is answered as it was, not run again.
ALTER TABLE redo_state ADD COLUMN state INTEGER NOT NULL DEFAULT 0;
ALTER TABLE redo_state ADD COLUMN answered BLOB;
UPDATE redo_state SET state = (abs(random()) % 9223372036854775806) + 1 WHERE id = 1;
