-- Paged directory listing (FUSE readdir): children of a directory in inode order, resumed after
-- the last inode number returned, without a per-stream snapshot.
CREATE INDEX IF NOT EXISTS inodes_by_parent_ino ON inodes (parent, ino) WHERE parent IS NOT NULL;
