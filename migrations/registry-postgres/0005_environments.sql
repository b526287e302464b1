-- PostgreSQL spelling of migrations/registry/0005_environments.sql (BIGINT for INTEGER, identity columns, text compared bytewise).
-- Execution environments (sandbox containers bound to one scope) and their background processes.

-- Environment states: creating -> running -> ended; creating -> failed | ended. `ended` and `failed` are final.
CREATE TABLE environment_state_transitions (
    from_state TEXT COLLATE "C" NOT NULL,
    to_state   TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT INTO environment_state_transitions (from_state, to_state) VALUES
    ('creating', 'running'),
    ('creating', 'failed'),
    ('creating', 'ended'),
    ('running', 'ended');

CREATE TABLE environments (
    deployment_id                 TEXT COLLATE "C"    NOT NULL,
    environment_id                TEXT COLLATE "C"    NOT NULL,
    scope_id                      TEXT COLLATE "C"    NOT NULL,
    owner_id                      TEXT COLLATE "C"    NOT NULL,
    user_id                       TEXT COLLATE "C"    NOT NULL,
    thread_id                     TEXT COLLATE "C"    NOT NULL,
    container_id                  TEXT COLLATE "C",
    read_only                     BIGINT NOT NULL DEFAULT 0 CHECK (read_only IN (0, 1)),
    state                         TEXT COLLATE "C"    NOT NULL CHECK (state IN ('creating', 'running', 'ended', 'failed')),
    revision                      BIGINT NOT NULL DEFAULT 1 CHECK (revision >= 1),
    requested_max_runtime_seconds BIGINT,
    effective_max_runtime_seconds BIGINT NOT NULL CHECK (effective_max_runtime_seconds >= 1),
    created_at                    BIGINT NOT NULL,
    started_at                    BIGINT,
    ended_at                      BIGINT,
    -- Seconds between started_at and ended_at, rounded up; 0 if it never started.
    runtime_seconds               BIGINT CHECK (runtime_seconds IS NULL OR runtime_seconds >= 0),
    end_reason                    TEXT COLLATE "C",
    PRIMARY KEY (deployment_id, environment_id),
    FOREIGN KEY (deployment_id, scope_id) REFERENCES scopes (deployment_id, scope_id),
    FOREIGN KEY (deployment_id, owner_id) REFERENCES scope_owners (deployment_id, owner_id)
);
CREATE INDEX environments_by_scope ON environments (deployment_id, scope_id, state);
CREATE INDEX environments_live ON environments (deployment_id, state) WHERE state IN ('creating', 'running');

-- Background process states: starting -> running -> exited | stopped | lost; starting -> failed | lost.
CREATE TABLE process_state_transitions (
    from_state TEXT COLLATE "C" NOT NULL,
    to_state   TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT INTO process_state_transitions (from_state, to_state) VALUES
    ('starting', 'running'),
    ('starting', 'failed'),
    ('starting', 'lost'),
    ('running', 'exited'),
    ('running', 'stopped'),
    ('running', 'lost');

CREATE TABLE environment_processes (
    deployment_id  TEXT COLLATE "C"    NOT NULL,
    process_id     TEXT COLLATE "C"    NOT NULL,
    scope_id       TEXT COLLATE "C"    NOT NULL,
    environment_id TEXT COLLATE "C"    NOT NULL,
    owner_id       TEXT COLLATE "C"    NOT NULL,
    command        TEXT COLLATE "C"    NOT NULL,
    exec_id        TEXT COLLATE "C",
    state          TEXT COLLATE "C"    NOT NULL CHECK (state IN ('starting', 'running', 'exited', 'stopped', 'failed', 'lost')),
    revision       BIGINT NOT NULL DEFAULT 1 CHECK (revision >= 1),
    exit_code      BIGINT,
    created_at     BIGINT NOT NULL,
    started_at     BIGINT,
    ended_at       BIGINT,
    end_reason     TEXT COLLATE "C",
    PRIMARY KEY (deployment_id, process_id),
    FOREIGN KEY (deployment_id, environment_id) REFERENCES environments (deployment_id, environment_id),
    FOREIGN KEY (deployment_id, owner_id) REFERENCES scope_owners (deployment_id, owner_id)
);
CREATE INDEX environment_processes_by_scope ON environment_processes (deployment_id, scope_id, created_at);
CREATE INDEX environment_processes_by_env ON environment_processes (deployment_id, environment_id, state);
