-- PostgreSQL spelling of migrations/registry/0007_environment_outputs.sql (BIGINT for INTEGER, identity columns, text compared bytewise).
-- Seed 003 §4.5 / §3.8 / §10.3: what an environment was created with, and the manifest of the
-- files it produced (its artifacts).

-- The create_environment fields the daemon records (resource_class, backend_policy, execution mode,
-- limits, input_objects, artifact_prefix, default_output_paths, budget_snapshot) as canonical JSON.
ALTER TABLE environments ADD COLUMN create_options TEXT COLLATE "C";

-- One manifest entry per artifact file: its size, SHA-256 and content type (from the extension),
-- and when the artifact registrar registered it (NULL: not yet).
ALTER TABLE artifacts ADD COLUMN size_bytes BIGINT CHECK (size_bytes IS NULL OR size_bytes >= 0);
ALTER TABLE artifacts ADD COLUMN sha256 TEXT COLLATE "C";
ALTER TABLE artifacts ADD COLUMN content_type TEXT COLLATE "C";
ALTER TABLE artifacts ADD COLUMN registered_at BIGINT;
