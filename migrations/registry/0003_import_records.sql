-- Legacy import audit records (seed 000 §11.1): one row per (scope, idempotency key), recording the
-- source in the read-only legacy workspace, the target in the scope, when, and what was copied.

-- Import states: `applying` (reserved before the copy) → `completed`; a failed copy deletes its
-- `applying` row so the same key can be retried.
CREATE TABLE import_state_transitions (
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    PRIMARY KEY (from_state, to_state)
) WITHOUT ROWID;
INSERT INTO import_state_transitions (from_state, to_state) VALUES
    ('applying', 'completed');

CREATE TABLE import_records (
    deployment_id   TEXT    NOT NULL,
    scope_id        TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    source_path     TEXT    NOT NULL,  -- relative to legacy_root, normalized
    target_path     TEXT    NOT NULL,  -- relative to the scope root, normalized
    overwrite       INTEGER NOT NULL CHECK (overwrite IN (0, 1)),
    state           TEXT    NOT NULL CHECK (state IN ('applying', 'completed')),
    size_bytes      INTEGER CHECK (size_bytes IS NULL OR size_bytes >= 0),
    sha256          TEXT,
    created_at      INTEGER NOT NULL,
    completed_at    INTEGER,
    PRIMARY KEY (deployment_id, scope_id, idempotency_key),
    FOREIGN KEY (deployment_id, scope_id) REFERENCES scopes (deployment_id, scope_id),
    CHECK ((state = 'completed') = (size_bytes IS NOT NULL AND sha256 IS NOT NULL AND completed_at IS NOT NULL))
);
