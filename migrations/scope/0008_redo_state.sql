-- Grouped commits (issue 10): mutations of a scope's metadata commit in batches, and between two
-- commits each one is recorded in the database's redo log (`meta.sqlite3-redo`) as the statements
-- it ran with their values. `epoch` is the batch committed last: the log holds the mutations of
-- batch `epoch + 1`, replayed when the database is opened after a killed daemon.
CREATE TABLE redo_state (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL CHECK (epoch >= 0)
);
INSERT INTO redo_state (id, epoch) VALUES (1, 0);
