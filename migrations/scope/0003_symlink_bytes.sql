-- Symlink targets are charged to the byte quota: `usage.bytes` is the sum of the sizes of regular
-- files and symlinks (a symlink's size is its target's length).
UPDATE usage SET bytes = bytes + (SELECT COALESCE(SUM(size), 0) FROM inodes WHERE kind = 'symlink') WHERE id = 1;
