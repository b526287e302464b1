-- PostgreSQL spelling of migrations/registry/0002_owners_runs_leases.sql (BIGINT for INTEGER, identity columns, text compared bytewise).
-- Registry: scope owners, run reservations, deployment leases, lifecycle bookkeeping (state machines as data).

-- Why a `deleting` scope could not finish (JSON array of owner ids), and when its objects were purged.
ALTER TABLE scopes ADD COLUMN delete_blocked_by TEXT COLLATE "C";
ALTER TABLE scopes ADD COLUMN purged_at BIGINT;

-- Owner states; `terminal`, `failed` and `quarantined` are settled (no way back to `active`).
CREATE TABLE owner_state_transitions (
    from_state TEXT COLLATE "C" NOT NULL,
    to_state   TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT INTO owner_state_transitions (from_state, to_state) VALUES
    ('reserved', 'active'),
    ('reserved', 'draining'),
    ('reserved', 'terminal'),
    ('reserved', 'failed'),
    ('reserved', 'quarantined'),
    ('active', 'draining'),
    ('active', 'terminal'),
    ('active', 'failed'),
    ('active', 'quarantined'),
    ('draining', 'terminal'),
    ('draining', 'failed'),
    ('draining', 'quarantined'),
    ('failed', 'terminal'),
    ('failed', 'quarantined'),
    ('terminal', 'quarantined'),
    ('quarantined', 'terminal');

CREATE TABLE scope_owners (
    deployment_id   TEXT COLLATE "C"    NOT NULL,
    owner_id        TEXT COLLATE "C"    NOT NULL,
    scope_id        TEXT COLLATE "C"    NOT NULL,
    owner_type      TEXT COLLATE "C"    NOT NULL CHECK (owner_type IN ('primary_thread', 'async_thread', 'memory_worker', 'cron',
                                                           'background_process', 'run', 'environment')),
    resource_id     TEXT COLLATE "C",
    parent_owner_id TEXT COLLATE "C",
    state           TEXT COLLATE "C"    NOT NULL CHECK (state IN ('reserved', 'active', 'draining', 'terminal', 'failed', 'quarantined')),
    revision        BIGINT NOT NULL DEFAULT 1 CHECK (revision >= 1),
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    terminal_at     BIGINT,
    PRIMARY KEY (deployment_id, owner_id),
    FOREIGN KEY (deployment_id, scope_id) REFERENCES scopes (deployment_id, scope_id)
);
CREATE UNIQUE INDEX scope_owners_resource ON scope_owners (deployment_id, owner_type, resource_id)
    WHERE resource_id IS NOT NULL;
CREATE INDEX scope_owners_by_scope ON scope_owners (deployment_id, scope_id, state);

-- Run request states: reserved -> started -> completed | failed | cancelled.
CREATE TABLE run_request_state_transitions (
    from_state TEXT COLLATE "C" NOT NULL,
    to_state   TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT INTO run_request_state_transitions (from_state, to_state) VALUES
    ('reserved', 'started'),
    ('reserved', 'completed'),
    ('reserved', 'failed'),
    ('reserved', 'cancelled'),
    ('started', 'completed'),
    ('started', 'failed'),
    ('started', 'cancelled');

CREATE TABLE scope_run_requests (
    deployment_id  TEXT COLLATE "C"    NOT NULL,
    scope_id       TEXT COLLATE "C"    NOT NULL,
    run_request_id TEXT COLLATE "C"    NOT NULL,
    turn_id        TEXT COLLATE "C"    NOT NULL,
    interrupt_key  TEXT COLLATE "C",
    request_hash   TEXT COLLATE "C"    NOT NULL,
    run_owner_id   TEXT COLLATE "C"    NOT NULL,
    run_id         TEXT COLLATE "C",
    state          TEXT COLLATE "C"    NOT NULL CHECK (state IN ('reserved', 'started', 'completed', 'failed', 'cancelled')),
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL,
    PRIMARY KEY (deployment_id, scope_id, run_request_id),
    FOREIGN KEY (deployment_id, scope_id) REFERENCES scopes (deployment_id, scope_id),
    FOREIGN KEY (deployment_id, run_owner_id) REFERENCES scope_owners (deployment_id, owner_id)
);
CREATE UNIQUE INDEX scope_run_requests_interrupt ON scope_run_requests (deployment_id, scope_id, interrupt_key)
    WHERE interrupt_key IS NOT NULL;
CREATE INDEX scope_run_requests_turn ON scope_run_requests (deployment_id, scope_id, turn_id);

-- Expiring deployment-wide leases (`workspace-cutover`, `maintenance`, ...).
CREATE TABLE deployment_locks (
    deployment_id TEXT COLLATE "C"    NOT NULL,
    lock_name     TEXT COLLATE "C"    NOT NULL,
    operation_id  TEXT COLLATE "C"    NOT NULL,
    expires_at    BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    PRIMARY KEY (deployment_id, lock_name)
);

CREATE INDEX scope_operations_by_scope ON scope_operations (deployment_id, scope_id, state);
