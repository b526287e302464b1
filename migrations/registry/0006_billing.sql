-- Compute billing (seed 003 §9–§11): accounts, the compute usage log, the wallet ledger and the
-- artifacts an environment produced. Money is INTEGER micro-units (NUMERIC(12,6) semantics).

-- One account per user. Created on first use with the default plan.
CREATE TABLE accounts (
    user_id                         TEXT    PRIMARY KEY,
    plan                            TEXT    NOT NULL,
    compute_minutes_remaining       INTEGER NOT NULL DEFAULT 0,
    compute_minutes_used            INTEGER NOT NULL DEFAULT 0 CHECK (compute_minutes_used >= 0),
    compute_minutes_lifetime        INTEGER NOT NULL DEFAULT 0 CHECK (compute_minutes_lifetime >= 0),
    compute_overtime_charged_micros INTEGER NOT NULL DEFAULT 0 CHECK (compute_overtime_charged_micros >= 0),
    cash_balance_micros             INTEGER NOT NULL DEFAULT 0 CHECK (cash_balance_micros >= 0),
    total_credited_micros           INTEGER NOT NULL DEFAULT 0 CHECK (total_credited_micros >= 0),
    compute_quota_monthly           INTEGER NOT NULL DEFAULT 0 CHECK (compute_quota_monthly >= 0),
    compute_quota_period_start      INTEGER NOT NULL,
    compute_quota_period_end        INTEGER NOT NULL,
    compute_quota_refreshed_at      INTEGER,
    created_at                      INTEGER NOT NULL,
    updated_at                      INTEGER NOT NULL,
    CHECK (compute_quota_period_end > compute_quota_period_start)
) WITHOUT ROWID;

-- Usage states: pending -> settled. A settlement claims, charges, writes the ledger and marks the
-- row settled in one BEGIN IMMEDIATE transaction, so `claimed` never persists.
CREATE TABLE usage_state_transitions (
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    PRIMARY KEY (from_state, to_state)
) WITHOUT ROWID;
INSERT INTO usage_state_transitions (from_state, to_state) VALUES ('pending', 'settled');

-- Artifact registration states: none (no artifacts) | pending -> registered | unregistered
-- (gave up after the retry limit; settlement proceeds). An operator may still mark them registered.
CREATE TABLE compute_usage_log (
    usage_id                INTEGER PRIMARY KEY AUTOINCREMENT,
    environment_id          TEXT    NOT NULL UNIQUE,
    user_id                 TEXT    NOT NULL,
    thread_id               TEXT    NOT NULL,
    runtime_seconds         INTEGER NOT NULL CHECK (runtime_seconds >= 0),
    compute_minutes         INTEGER NOT NULL CHECK (compute_minutes >= 1),
    settlement_status       TEXT    NOT NULL DEFAULT 'pending' CHECK (settlement_status IN ('pending', 'settled')),
    artifacts_state         TEXT    NOT NULL CHECK (artifacts_state IN ('none', 'pending', 'registered', 'unregistered')),
    artifact_attempts       INTEGER NOT NULL DEFAULT 0 CHECK (artifact_attempts >= 0),
    artifact_error          TEXT,
    settle_failures         INTEGER NOT NULL DEFAULT 0 CHECK (settle_failures >= 0),
    settlement_error        TEXT,
    next_attempt_at         INTEGER,
    last_attempt_at         INTEGER,
    -- Set by the settlement.
    plan                    TEXT,
    free_minutes            INTEGER,
    overtime_minutes        INTEGER,
    overtime_charged_micros INTEGER,
    quota_remaining         INTEGER,
    currency                TEXT,
    pricing_snapshot        TEXT,
    ledger_entry_id         INTEGER,
    created_at              INTEGER NOT NULL,
    settled_at              INTEGER,
    CHECK ((settlement_status = 'settled') = (settled_at IS NOT NULL AND ledger_entry_id IS NOT NULL))
);
CREATE INDEX compute_usage_pending ON compute_usage_log (last_attempt_at, usage_id) WHERE settlement_status = 'pending';
CREATE INDEX compute_usage_by_user ON compute_usage_log (user_id, usage_id);

-- Every money movement: compute settlements (debit, possibly of 0 when free minutes paid) and credits.
CREATE TABLE wallet_ledger (
    entry_id             INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id              TEXT    NOT NULL REFERENCES accounts (user_id),
    idempotency_key      TEXT    NOT NULL UNIQUE,
    entry_type           TEXT    NOT NULL CHECK (entry_type IN ('compute_overtime', 'credit')),
    source_type          TEXT    NOT NULL,
    source_id            TEXT    NOT NULL,
    direction            TEXT    NOT NULL CHECK (direction IN ('debit', 'credit')),
    amount_micros        INTEGER NOT NULL CHECK (amount_micros >= 0),
    balance_after_micros INTEGER NOT NULL CHECK (balance_after_micros >= 0),
    compute_minutes      INTEGER,
    free_minutes         INTEGER,
    currency             TEXT    NOT NULL,
    pricing_snapshot     TEXT,
    note                 TEXT,
    created_at           INTEGER NOT NULL
);
CREATE INDEX wallet_ledger_by_user ON wallet_ledger (user_id, entry_id);

-- Files an environment created or changed in its scope; idempotent on (environment, path).
CREATE TABLE artifacts (
    environment_id TEXT    NOT NULL,
    path           TEXT    NOT NULL,
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (environment_id, path)
) WITHOUT ROWID;
