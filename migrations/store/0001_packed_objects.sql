-- Small objects of a local object directory, packed in one database instead of one file each: a
-- file per 4 KiB block costs the host file system an inode allocation and two flushes per object.
-- `size` is `length(data)`, kept so that head and list never read the bytes.
CREATE TABLE objects (
    key  TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    data BLOB NOT NULL
);
