-- PostgreSQL spelling of migrations/registry/0009_scope_users.sql (BIGINT for INTEGER, identity columns, text compared bytewise).
-- Registry: the user a scope belongs to (seed 003 §3.7: peer threads and the global store are
-- per user). NULL until provisioning names one or the first signed tool request binds it; once
-- set it never changes (a request of another user is answered like an unknown thread).
ALTER TABLE scopes ADD COLUMN user_id TEXT COLLATE "C" CHECK (user_id IS NULL OR length(user_id) BETWEEN 1 AND 256);
CREATE INDEX scopes_by_user ON scopes (deployment_id, user_id) WHERE user_id IS NOT NULL;
