-- PostgreSQL spelling of migrations/registry/0003_import_records.sql (BIGINT for INTEGER, identity columns, text compared bytewise).
-- Legacy import audit records (seed 000 §11.1): one row per (scope, idempotency key), recording the
-- source in the read-only legacy workspace, the target in the scope, when, and what was copied.

-- Import states: `applying` (reserved before the copy) → `completed`; a failed copy deletes its
-- `applying` row so the same key can be retried.
CREATE TABLE import_state_transitions (
    from_state TEXT COLLATE "C" NOT NULL,
    to_state   TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT INTO import_state_transitions (from_state, to_state) VALUES
    ('applying', 'completed');

CREATE TABLE import_records (
    deployment_id   TEXT COLLATE "C"    NOT NULL,
    scope_id        TEXT COLLATE "C"    NOT NULL,
    idempotency_key TEXT COLLATE "C"    NOT NULL,
    source_path     TEXT COLLATE "C"    NOT NULL,  -- relative to legacy_root, normalized
    target_path     TEXT COLLATE "C"    NOT NULL,  -- relative to the scope root, normalized
    overwrite       BIGINT NOT NULL CHECK (overwrite IN (0, 1)),
    state           TEXT COLLATE "C"    NOT NULL CHECK (state IN ('applying', 'completed')),
    size_bytes      BIGINT CHECK (size_bytes IS NULL OR size_bytes >= 0),
    sha256          TEXT COLLATE "C",
    created_at      BIGINT NOT NULL,
    completed_at    BIGINT,
    PRIMARY KEY (deployment_id, scope_id, idempotency_key),
    FOREIGN KEY (deployment_id, scope_id) REFERENCES scopes (deployment_id, scope_id),
    CHECK ((state = 'completed') = (size_bytes IS NOT NULL AND sha256 IS NOT NULL AND completed_at IS NOT NULL))
);
