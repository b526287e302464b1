-- Extended attributes (`user.*` only): one row per name of an inode, deleted with the inode.
-- Each attribute is charged to the byte quota as length(name) + length(value): the triggers keep
-- `usage.bytes` equal to the sizes of files and symlinks plus these, whatever deletes a row
-- (removexattr, or the ON DELETE CASCADE of the inode's deletion).
CREATE TABLE xattrs (
    ino   INTEGER NOT NULL REFERENCES inodes (ino) ON DELETE CASCADE,
    name  BLOB    NOT NULL,
    value BLOB    NOT NULL,
    PRIMARY KEY (ino, name)
) WITHOUT ROWID;

CREATE TRIGGER xattrs_charge AFTER INSERT ON xattrs BEGIN
    UPDATE usage SET bytes = bytes + length(NEW.name) + length(NEW.value) WHERE id = 1;
END;

CREATE TRIGGER xattrs_recharge AFTER UPDATE ON xattrs BEGIN
    UPDATE usage SET bytes = bytes - length(OLD.name) - length(OLD.value) + length(NEW.name) + length(NEW.value)
    WHERE id = 1;
END;

CREATE TRIGGER xattrs_release AFTER DELETE ON xattrs BEGIN
    UPDATE usage SET bytes = bytes - length(OLD.name) - length(OLD.value) WHERE id = 1;
END;
