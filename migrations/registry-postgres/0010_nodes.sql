-- PostgreSQL spelling of migrations/registry/0010_nodes.sql (BIGINT for INTEGER, identity columns, text compared bytewise).
-- Registry: the nodes of a deployment and which node serves each scope (issue 23: several
-- daemons). A node renews `lease_until` with its heartbeat; a scope is served by the node its
-- placement names, under an `epoch` that increases at every change of node, and its metadata's
-- shipped chain is the generation and batch recorded here (a deposed node cannot record).

CREATE TABLE node_state_transitions (
    from_state TEXT COLLATE "C" NOT NULL,
    to_state   TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT INTO node_state_transitions (from_state, to_state) VALUES
    ('active', 'draining'),
    ('draining', 'active'),
    ('active', 'removed'),
    ('draining', 'removed'),
    ('removed', 'active');

CREATE TABLE nodes (
    deployment_id TEXT COLLATE "C"    NOT NULL,
    node_id       TEXT COLLATE "C"    NOT NULL CHECK (length(node_id) BETWEEN 1 AND 64),
    api_address   TEXT COLLATE "C"    NOT NULL CHECK (length(api_address) BETWEEN 1 AND 256),
    state         TEXT COLLATE "C"    NOT NULL CHECK (state IN ('active', 'draining', 'removed')),
    max_scopes    BIGINT NOT NULL CHECK (max_scopes >= 0),
    started_at    BIGINT NOT NULL,
    heartbeat_at  BIGINT NOT NULL,
    lease_until   BIGINT NOT NULL,
    -- What the node reported with its last heartbeat (placement weighs them).
    bytes_used    BIGINT NOT NULL DEFAULT 0,
    environments  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (deployment_id, node_id)
);

CREATE TABLE scope_placement (
    deployment_id TEXT COLLATE "C"    NOT NULL,
    scope_id      TEXT COLLATE "C"    NOT NULL,
    node_id       TEXT COLLATE "C"    NOT NULL,
    epoch         BIGINT NOT NULL CHECK (epoch >= 1),
    meta_gen      BIGINT,
    meta_seq      BIGINT,
    meta_state    BIGINT,
    updated_at    BIGINT NOT NULL,
    PRIMARY KEY (deployment_id, scope_id),
    FOREIGN KEY (deployment_id, scope_id) REFERENCES scopes (deployment_id, scope_id),
    FOREIGN KEY (deployment_id, node_id) REFERENCES nodes (deployment_id, node_id)
);
CREATE INDEX scope_placement_by_node ON scope_placement (deployment_id, node_id);
