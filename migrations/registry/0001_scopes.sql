-- Registry: scopes and their state machine (transitions as data).

CREATE TABLE scope_state_transitions (
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    PRIMARY KEY (from_state, to_state)
) WITHOUT ROWID;
INSERT INTO scope_state_transitions (from_state, to_state) VALUES
    ('provisioning', 'draft'),
    ('draft', 'active'),
    ('draft', 'deleting'),
    ('active', 'deleting'),
    ('deleting', 'deleted');

CREATE TABLE scopes (
    deployment_id     TEXT    NOT NULL,
    scope_id          TEXT    NOT NULL,
    primary_thread_id TEXT    NOT NULL,
    state             TEXT    NOT NULL CHECK (state IN ('provisioning', 'draft', 'active', 'deleting', 'deleted')),
    revision          INTEGER NOT NULL DEFAULT 1,
    quota_bytes       INTEGER,
    quota_inodes      INTEGER,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    deleted_at        INTEGER,
    PRIMARY KEY (deployment_id, scope_id),
    UNIQUE (deployment_id, primary_thread_id)
);
