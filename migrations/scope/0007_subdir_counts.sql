-- Subdirectory counts (issue 10): a directory's link count is 2 + its subdirectories, asked for by
-- every getattr, lookup and listing of a directory. Counting them per request cost a scan of the
-- directory's children (quadratic in a directory's size over a create or rm -rf of its files); the
-- count is kept in the directory's row instead, by triggers, so every statement that gives a
-- directory a parent, moves it or deletes it keeps it (insert, rename, exchange, rmdir).

ALTER TABLE inodes ADD COLUMN subdirs INTEGER NOT NULL DEFAULT 0;

UPDATE inodes SET subdirs = (SELECT COUNT(*) FROM inodes c WHERE c.parent = inodes.ino AND c.kind = 'dir')
WHERE kind = 'dir';

CREATE TRIGGER subdirs_insert AFTER INSERT ON inodes WHEN NEW.kind = 'dir' AND NEW.parent IS NOT NULL BEGIN
    UPDATE inodes SET subdirs = subdirs + 1 WHERE ino = NEW.parent;
END;

CREATE TRIGGER subdirs_delete AFTER DELETE ON inodes WHEN OLD.kind = 'dir' AND OLD.parent IS NOT NULL BEGIN
    UPDATE inodes SET subdirs = subdirs - 1 WHERE ino = OLD.parent;
END;

-- A directory moved aside during an exchange has no parent for a moment (NULL): counted out, then in.
CREATE TRIGGER subdirs_move AFTER UPDATE OF parent ON inodes
WHEN NEW.kind = 'dir' AND OLD.parent IS NOT NEW.parent BEGIN
    UPDATE inodes SET subdirs = subdirs - 1 WHERE ino = OLD.parent;
    UPDATE inodes SET subdirs = subdirs + 1 WHERE ino = NEW.parent;
END;
