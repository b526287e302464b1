-- PostgreSQL spelling of migrations/registry/0001_scopes.sql (BIGINT for INTEGER, identity columns, text compared bytewise).
-- Registry: scopes and their state machine, provisioning operations (state machines as data).

-- Allowed scope state changes; a transition is legal iff its (from, to) row exists.
CREATE TABLE scope_state_transitions (
    from_state TEXT COLLATE "C" NOT NULL,
    to_state   TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT INTO scope_state_transitions (from_state, to_state) VALUES
    ('provisioning', 'draft'),
    ('draft', 'active'),
    ('draft', 'deleting'),
    ('active', 'deleting'),
    ('deleting', 'deleted');

CREATE TABLE scopes (
    deployment_id     TEXT COLLATE "C"    NOT NULL,
    scope_id          TEXT COLLATE "C"    NOT NULL,
    primary_thread_id TEXT COLLATE "C"    NOT NULL,
    state             TEXT COLLATE "C"    NOT NULL CHECK (state IN ('provisioning', 'draft', 'active', 'deleting', 'deleted')),
    revision          BIGINT NOT NULL DEFAULT 1 CHECK (revision >= 1),
    quota_bytes       BIGINT CHECK (quota_bytes IS NULL OR quota_bytes >= 0),
    quota_inodes      BIGINT CHECK (quota_inodes IS NULL OR quota_inodes >= 0),
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    deleted_at        BIGINT,
    PRIMARY KEY (deployment_id, scope_id),
    UNIQUE (deployment_id, primary_thread_id)
);
CREATE INDEX scopes_by_state ON scopes (deployment_id, state);

-- Allowed operation state changes (saga records).
CREATE TABLE operation_state_transitions (
    from_state TEXT COLLATE "C" NOT NULL,
    to_state   TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
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
    deployment_id        TEXT COLLATE "C"    NOT NULL,
    operation_id         TEXT COLLATE "C"    NOT NULL,
    scope_id             TEXT COLLATE "C"    NOT NULL,
    kind                 TEXT COLLATE "C"    NOT NULL CHECK (kind IN ('provision', 'delete', 'purge')),
    expected_revision    BIGINT,
    state                TEXT COLLATE "C"    NOT NULL CHECK (state IN ('reserved', 'applying', 'completed', 'failed', 'compensating', 'compensated')),
    external_resource_id TEXT COLLATE "C",
    result_sha256        TEXT COLLATE "C",
    last_error_code      TEXT COLLATE "C",
    created_at           BIGINT NOT NULL,
    updated_at           BIGINT NOT NULL,
    PRIMARY KEY (deployment_id, operation_id),
    FOREIGN KEY (deployment_id, scope_id) REFERENCES scopes (deployment_id, scope_id)
);
CREATE INDEX scope_operations_open ON scope_operations (deployment_id, state)
    WHERE state NOT IN ('completed', 'compensated');
