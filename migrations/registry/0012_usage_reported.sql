-- Registry: usage a gateway settled (issue 24 item 5, `[billing] mode = "report"`). In report mode
-- the gateway is the billing authority: `/admin/mark-settled` moves a record from pending to
-- `reported` (settled elsewhere: no charge, no ledger row here); `settled` keeps meaning charged by
-- this daemon, with its ledger row. SQLite cannot change a CHECK in place: the table is rebuilt.
CREATE TABLE compute_usage_log_v12 (
    usage_id                INTEGER PRIMARY KEY AUTOINCREMENT,
    environment_id          TEXT    NOT NULL UNIQUE,
    user_id                 TEXT    NOT NULL,
    thread_id               TEXT    NOT NULL,
    runtime_seconds         INTEGER NOT NULL CHECK (runtime_seconds >= 0),
    compute_minutes         INTEGER NOT NULL CHECK (compute_minutes >= 1),
    settlement_status       TEXT    NOT NULL DEFAULT 'pending' CHECK (settlement_status IN ('pending', 'settled', 'reported')),
    artifacts_state         TEXT    NOT NULL CHECK (artifacts_state IN ('none', 'pending', 'registered', 'unregistered')),
    artifact_attempts       INTEGER NOT NULL DEFAULT 0 CHECK (artifact_attempts >= 0),
    artifact_error          TEXT,
    settle_failures         INTEGER NOT NULL DEFAULT 0 CHECK (settle_failures >= 0),
    settlement_error        TEXT,
    next_attempt_at         INTEGER,
    last_attempt_at         INTEGER,
    plan                    TEXT,
    free_minutes            INTEGER,
    overtime_minutes        INTEGER,
    overtime_charged_micros INTEGER,
    quota_remaining         INTEGER,
    currency                TEXT,
    pricing_snapshot        TEXT,
    ledger_entry_id         INTEGER,
    created_at              INTEGER NOT NULL,
    settled_at              INTEGER,
    CHECK ((settlement_status = 'settled') = (ledger_entry_id IS NOT NULL)),
    CHECK ((settlement_status = 'pending') = (settled_at IS NULL))
);
INSERT INTO compute_usage_log_v12 SELECT * FROM compute_usage_log;
-- Ids are never reused: the rebuilt table continues the old one's sequence.
DELETE FROM sqlite_sequence WHERE name = 'compute_usage_log_v12';
INSERT INTO sqlite_sequence (name, seq) SELECT 'compute_usage_log_v12', seq FROM sqlite_sequence WHERE name = 'compute_usage_log';
DROP TABLE compute_usage_log;
ALTER TABLE compute_usage_log_v12 RENAME TO compute_usage_log;
CREATE INDEX compute_usage_pending ON compute_usage_log (last_attempt_at, usage_id) WHERE settlement_status = 'pending';
CREATE INDEX compute_usage_by_user ON compute_usage_log (user_id, usage_id);
INSERT INTO usage_state_transitions (from_state, to_state) VALUES ('pending', 'reported');
