-- The inline journal: the bytes of small staged blocks live here, written in the same transaction
-- as the file version that first references them, instead of as files in staging. A row goes when
-- the block's upload is recorded (state 'uploaded') or gc collects the block.
CREATE TABLE staged_inline (
    sha256 TEXT PRIMARY KEY,
    data   BLOB NOT NULL
);
