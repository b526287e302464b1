-- Hard links and device nodes (issue 10).
--
-- `inodes` is rebuilt (SQLite cannot change a CHECK constraint in place): kinds 'char' and
-- 'block' join the inert special files, `nlink` counts the names of a non-directory (0: unlinked
-- while open) and `rdev` holds a device node's device number. `MetaDb::open` runs migrations with
-- foreign keys off, so dropping the old table cascades nothing. The AUTOINCREMENT high-water mark
-- is carried over: inode numbers are never reused.
--
-- An inode's first name stays in `inodes.parent`/`inodes.name`; every further name of a regular
-- file, symlink or special file is a row of `links`. Directories never have more than one name.

CREATE TEMP TABLE inode_seq AS SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'inodes'), 0) AS seq;

CREATE TABLE inodes_v4 (
    ino            INTEGER PRIMARY KEY AUTOINCREMENT, -- never reused
    parent         INTEGER,                           -- first name; NULL: root, or unlinked while open
    name           BLOB,
    kind           TEXT    NOT NULL CHECK (kind IN ('file', 'dir', 'symlink', 'fifo', 'socket', 'char', 'block')),
    perm           INTEGER NOT NULL,
    uid            INTEGER NOT NULL,
    gid            INTEGER NOT NULL,
    size           INTEGER NOT NULL DEFAULT 0 CHECK (size >= 0),
    atime_ns       INTEGER NOT NULL,
    mtime_ns       INTEGER NOT NULL,
    ctime_ns       INTEGER NOT NULL,
    symlink_target BLOB,
    content_sha256 TEXT,                              -- whole-file hash when known
    version        INTEGER NOT NULL DEFAULT 0,
    nlink          INTEGER NOT NULL DEFAULT 1 CHECK (nlink >= 0),
    rdev           INTEGER NOT NULL DEFAULT 0
);

INSERT INTO inodes_v4 (ino, parent, name, kind, perm, uid, gid, size, atime_ns, mtime_ns, ctime_ns,
                       symlink_target, content_sha256, version, nlink, rdev)
SELECT ino, parent, name, kind, perm, uid, gid, size, atime_ns, mtime_ns, ctime_ns,
       symlink_target, content_sha256, version,
       CASE WHEN parent IS NULL AND ino <> 1 THEN 0 ELSE 1 END, 0
FROM inodes;

DROP TABLE inodes;
ALTER TABLE inodes_v4 RENAME TO inodes;
UPDATE sqlite_sequence SET seq = MAX(seq, (SELECT seq FROM temp.inode_seq)) WHERE name = 'inodes';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'inodes', seq FROM temp.inode_seq WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'inodes');
DROP TABLE temp.inode_seq;

CREATE UNIQUE INDEX inodes_by_parent_name ON inodes (parent, name) WHERE parent IS NOT NULL;
CREATE INDEX inodes_by_parent_ino ON inodes (parent, ino) WHERE parent IS NOT NULL;

-- Further names of an inode. `id` is never reused: a directory listing resumes after it.
CREATE TABLE links (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    parent INTEGER NOT NULL,
    name   BLOB    NOT NULL,
    ino    INTEGER NOT NULL REFERENCES inodes (ino) ON DELETE CASCADE
);
CREATE UNIQUE INDEX links_by_parent_name ON links (parent, name);
CREATE INDEX links_by_parent_id ON links (parent, id);
CREATE INDEX links_by_ino ON links (ino);

-- Names beyond an inode's first count against the inode quota with the inodes.
ALTER TABLE usage ADD COLUMN links INTEGER NOT NULL DEFAULT 0;
