-- Per-scope metadata: namespace tree, file block lists, block reference counts, usage.
-- Blocks in state 'staged' are the upload journal: their bytes sit fsynced in
-- <data_dir>/staging/<scope>/blocks/<sha256> until uploaded.

CREATE TABLE inodes (
    ino            INTEGER PRIMARY KEY AUTOINCREMENT, -- never reused
    parent         INTEGER,                           -- NULL: root, or unlinked while open
    name           BLOB,
    kind           TEXT    NOT NULL CHECK (kind IN ('file', 'dir', 'symlink', 'fifo', 'socket')),
    perm           INTEGER NOT NULL,
    uid            INTEGER NOT NULL,
    gid            INTEGER NOT NULL,
    size           INTEGER NOT NULL DEFAULT 0 CHECK (size >= 0),
    atime_ns       INTEGER NOT NULL,
    mtime_ns       INTEGER NOT NULL,
    ctime_ns       INTEGER NOT NULL,
    symlink_target BLOB,
    content_sha256 TEXT,                              -- whole-file hash when known
    version        INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX inodes_by_parent_name ON inodes (parent, name) WHERE parent IS NOT NULL;

CREATE TABLE file_blocks (
    ino    INTEGER NOT NULL REFERENCES inodes (ino) ON DELETE CASCADE,
    idx    INTEGER NOT NULL,
    sha256 TEXT    NOT NULL REFERENCES blocks (sha256),
    len    INTEGER NOT NULL CHECK (len > 0),
    PRIMARY KEY (ino, idx)
) WITHOUT ROWID;
CREATE INDEX file_blocks_by_sha ON file_blocks (sha256);

CREATE TABLE blocks (
    sha256              TEXT    PRIMARY KEY,
    len                 INTEGER NOT NULL,
    refcount            INTEGER NOT NULL CHECK (refcount >= 0),
    state               TEXT    NOT NULL CHECK (state IN ('staged', 'uploaded')),
    unreferenced_since  INTEGER                     -- unix seconds when refcount reached 0
) WITHOUT ROWID;

CREATE TABLE usage (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    files  INTEGER NOT NULL,
    bytes  INTEGER NOT NULL,
    inodes INTEGER NOT NULL
);
INSERT INTO usage (id, files, bytes, inodes) VALUES (1, 0, 0, 0);
