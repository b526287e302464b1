-- Registry: an artifact keeps its bytes (issue 24 item 6). When an environment ends with outputs,
-- the daemon takes a snapshot of its scope (O(metadata): blocks shared by reference) and hashes
-- the outputs from it; each artifact names that snapshot, so its bytes read back as recorded
-- however its file changes after (`/api/workspace/file?snapshotId=…`). NULL: recorded before.
ALTER TABLE artifacts ADD COLUMN snapshot_id TEXT;
