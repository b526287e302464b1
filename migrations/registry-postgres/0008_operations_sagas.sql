-- PostgreSQL spelling of migrations/registry/0008_operations_sagas.sql (BIGINT for INTEGER, identity columns, text compared bytewise).
-- Registry: operations of every saga kind (seed 000 §5.3, §11.1). `scope_operations` is rebuilt so
-- run and cron creation (`run`, `cron`) and the deployment-level `cutover` operation (scope_id NULL,
-- only for that kind) can be recorded.

CREATE TABLE scope_operations_v8 (
    deployment_id        TEXT COLLATE "C"    NOT NULL,
    operation_id         TEXT COLLATE "C"    NOT NULL,
    scope_id             TEXT COLLATE "C",
    kind                 TEXT COLLATE "C"    NOT NULL CHECK (kind IN ('provision', 'delete', 'purge', 'run', 'cron', 'cutover')),
    expected_revision    BIGINT,
    state                TEXT COLLATE "C"    NOT NULL CHECK (state IN ('reserved', 'applying', 'completed', 'failed', 'compensating', 'compensated')),
    external_resource_id TEXT COLLATE "C",
    result_sha256        TEXT COLLATE "C",
    last_error_code      TEXT COLLATE "C",
    created_at           BIGINT NOT NULL,
    updated_at           BIGINT NOT NULL,
    PRIMARY KEY (deployment_id, operation_id),
    FOREIGN KEY (deployment_id, scope_id) REFERENCES scopes (deployment_id, scope_id),
    CHECK ((scope_id IS NULL) = (kind = 'cutover'))
);
INSERT INTO scope_operations_v8 (deployment_id, operation_id, scope_id, kind, expected_revision, state,
                                 external_resource_id, result_sha256, last_error_code, created_at, updated_at)
    SELECT deployment_id, operation_id, scope_id, kind, expected_revision, state,
           external_resource_id, result_sha256, last_error_code, created_at, updated_at
    FROM scope_operations;
DROP TABLE scope_operations;
ALTER TABLE scope_operations_v8 RENAME TO scope_operations;
CREATE INDEX scope_operations_open ON scope_operations (deployment_id, state)
    WHERE state NOT IN ('completed', 'compensated');
CREATE INDEX scope_operations_by_scope ON scope_operations (deployment_id, scope_id, state);
CREATE INDEX scope_operations_by_resource ON scope_operations (deployment_id, kind, external_resource_id)
    WHERE external_resource_id IS NOT NULL;
