-- Seed 003 §4.5 / §3.8 / §10.3: what an environment was created with, and the manifest of the
-- files it produced (its artifacts).

-- The create_environment fields the daemon records (resource_class, backend_policy, execution mode,
-- limits, input_objects, artifact_prefix, default_output_paths, budget_snapshot) as canonical JSON.
ALTER TABLE environments ADD COLUMN create_options TEXT;

-- One manifest entry per artifact file: its size, SHA-256 and content type (from the extension),
-- and when the artifact registrar registered it (NULL: not yet).
ALTER TABLE artifacts ADD COLUMN size_bytes INTEGER CHECK (size_bytes IS NULL OR size_bytes >= 0);
ALTER TABLE artifacts ADD COLUMN sha256 TEXT;
ALTER TABLE artifacts ADD COLUMN content_type TEXT;
ALTER TABLE artifacts ADD COLUMN registered_at INTEGER;
