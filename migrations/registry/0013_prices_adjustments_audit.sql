-- Registry (issue 24 item 8): the price an environment was admitted at, which its usage carries
-- and settlement charges (seed 003 §9.2 `pricing_snapshot`); the operator's per-account quota
-- adjustment (§9.1 `compute_quota_adjustment`, minutes added to the plan's monthly quota); and the
-- admin audit log (§2 `exec_admin_audit_log`): one row per state-changing admin request, written in
-- the same transaction as the change.
ALTER TABLE environments ADD COLUMN pricing_snapshot TEXT;
ALTER TABLE accounts ADD COLUMN compute_quota_adjustment INTEGER NOT NULL DEFAULT 0;
CREATE TABLE admin_audit_log (
    audit_id   INTEGER PRIMARY KEY AUTOINCREMENT,
    action     TEXT    NOT NULL,
    subject    TEXT    NOT NULL,
    detail     TEXT    NOT NULL,
    created_at INTEGER NOT NULL
);
