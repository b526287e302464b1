-- PostgreSQL spelling of migrations/registry/0004_auth_nonces.sql (BIGINT for INTEGER, identity columns, text compared bytewise).
-- Single-use nonces of signed /tools requests (seed 003 §4.3): a nonce is recorded when its request
-- is accepted and kept until its signature window has passed; a second use is refused (replay).
CREATE TABLE auth_nonces (
    deployment_id TEXT COLLATE "C"    NOT NULL,
    nonce         TEXT COLLATE "C"    NOT NULL CHECK (length(nonce) BETWEEN 1 AND 128),
    -- Unix milliseconds after which the request could not verify any more, so the row can go.
    expires_at    BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    PRIMARY KEY (deployment_id, nonce)
);
CREATE INDEX auth_nonces_expiry ON auth_nonces (expires_at);
