-- Registry: scopes and their state machine, provisioning operations (state machines as data).

-- Allowed scope state changes; a transition is legal iff its (from, to) row exists.
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
    revision          INTEGER NOT NULL DEFAULT 1 CHECK (revision >= 1),
    quota_bytes       INTEGER CHECK (quota_bytes IS NULL OR quota_bytes >= 0),
    quota_inodes      INTEGER CHECK (quota_inodes IS NULL OR quota_inodes >= 0),
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    deleted_at        INTEGER,
    PRIMARY KEY (deployment_id, scope_id),
    UNIQUE (deployment_id, primary_thread_id)
);
CREATE INDEX scopes_by_state ON scopes (deployment_id, state);

-- Allowed operation state changes (saga records).
CREATE TABLE operation_state_transitions (
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    PRIMARY KEY (from_state, to_state)
) WITHOUT ROWID;
INSERT INTO operation_state_transitions (from_state, to_state) VALUES
    ('reserved', 'applying'),
    ('reserved', 'completed'),
    ('applying', 'completed'),
    ('reserved', 'failed'),
    ('applying', 'failed'),
    ('failed', 'applying'),
    ('failed', 'completed'),
    ('reserved', 'compensating'),
    ('applying', 'compensating'),
    ('failed', 'compensating'),
    ('compensating', 'compensated');

-- One saga record per idempotency key (operation_id) of a deployment.
CREATE TABLE scope_operations (
    deployment_id        TEXT    NOT NULL,
    operation_id         TEXT    NOT NULL,
    scope_id             TEXT    NOT NULL,
    kind                 TEXT    NOT NULL CHECK (kind IN ('provision', 'delete', 'purge')),
    expected_revision    INTEGER,
    state                TEXT    NOT NULL CHECK (state IN ('reserved', 'applying', 'completed', 'failed', 'compensating', 'compensated')),
    external_resource_id TEXT,
    result_sha256        TEXT,
    last_error_code      TEXT,
    created_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL,
    PRIMARY KEY (deployment_id, operation_id),
    FOREIGN KEY (deployment_id, scope_id) REFERENCES scopes (deployment_id, scope_id)
);
CREATE INDEX scope_operations_open ON scope_operations (deployment_id, state)
    WHERE state NOT IN ('completed', 'compensated');
