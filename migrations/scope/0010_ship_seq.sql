-- Metadata in the bucket (issue 23): every batch commit numbers the committed state in order
-- (`ship_seq`, 0 for a database never committed since), so the batches shipped to the object store
-- (`engine/ship.rs`) follow each other without a gap, and a restored database knows which shipped
-- batch it ends with.
ALTER TABLE redo_state ADD COLUMN ship_seq INTEGER NOT NULL DEFAULT 0;
