-- PostgreSQL spelling of migrations/registry/0011_forks.sql (BIGINT for INTEGER, identity columns, text compared bytewise).
-- Registry: forks and snapshots (issue 23 item 5). A fork or a snapshot is a scope whose metadata
-- was copied from another's; the blocks it shares live under the scope that wrote them. Each
-- (home, block, holder) row says `holder` refers to `home`'s block: gc and purge of `home` keep a
-- held block, and the last holder letting go of a block of a purged scope deletes it.
CREATE TABLE block_holds (
    deployment_id TEXT COLLATE "C" NOT NULL,
    home_scope    TEXT COLLATE "C" NOT NULL,
    sha256        TEXT COLLATE "C" NOT NULL CHECK (length(sha256) = 64),
    holder_scope  TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (deployment_id, home_scope, sha256, holder_scope)
);
CREATE INDEX block_holds_by_holder ON block_holds (deployment_id, holder_scope);

-- A scope made as a copy of another (a fork, or a snapshot's scope): recorded with the child's
-- provisioning, so a copy a crash interrupted is made again, never finished as an empty scope.
CREATE TABLE scope_forks (
    deployment_id   TEXT COLLATE "C"    NOT NULL,
    scope_id        TEXT COLLATE "C"    NOT NULL,
    parent_scope_id TEXT COLLATE "C"    NOT NULL,
    created_at      BIGINT NOT NULL,
    PRIMARY KEY (deployment_id, scope_id),
    FOREIGN KEY (deployment_id, scope_id) REFERENCES scopes (deployment_id, scope_id),
    FOREIGN KEY (deployment_id, parent_scope_id) REFERENCES scopes (deployment_id, scope_id)
);

-- Read-only points in time of a scope: each is kept as a scope of its own (never mounted,
-- read through the file API, restorable into its scope).
CREATE TABLE scope_snapshots (
    deployment_id     TEXT COLLATE "C"    NOT NULL,
    snapshot_id       TEXT COLLATE "C"    NOT NULL CHECK (length(snapshot_id) BETWEEN 1 AND 128),
    scope_id          TEXT COLLATE "C"    NOT NULL,
    snapshot_scope_id TEXT COLLATE "C"    NOT NULL,
    created_at        BIGINT NOT NULL,
    PRIMARY KEY (deployment_id, snapshot_id),
    UNIQUE (deployment_id, snapshot_scope_id),
    FOREIGN KEY (deployment_id, scope_id) REFERENCES scopes (deployment_id, scope_id),
    FOREIGN KEY (deployment_id, snapshot_scope_id) REFERENCES scopes (deployment_id, scope_id)
);
CREATE INDEX scope_snapshots_by_scope ON scope_snapshots (deployment_id, scope_id, created_at);
