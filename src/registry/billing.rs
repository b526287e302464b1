//! SQL of compute billing (seed 003 §9–§11): `accounts`, `compute_usage_log`, `wallet_ledger`, `artifacts`.
//!
//! A settlement is ONE `BEGIN IMMEDIATE` transaction: it reads the usage (settled → `already_settled`),
//! refuses while its artifacts are unregistered and under the retry limit, charges free minutes
//! first and overtime from cash, writes the ledger row (idempotency key
//! `compute:{user}:{thread}:{environment}`, UNIQUE) and marks the usage settled. Insufficient cash
//! returns `InsufficientComputeBalance` with nothing written. Accounts are created on first use with
//! the default plan; a monthly period that has ended is refreshed before the account is used.

mod accounts;
pub use accounts::MAX_QUOTA_ADJUSTMENT;
mod artifacts;
mod audit;
mod preflight;
mod reported;

pub(crate) use artifacts::record_manifest_in;
pub use artifacts::{ArtifactEntry, ArtifactRow};

use crate::registry::db::{params, Conn, OptionalExtension, Row, Tx};
use serde::Serialize;

use super::admin_audit::{self, AdminAction};
use super::{validate_key, Registry, RegistryError};
use crate::billing::{self, AccountBalance, BillingError, Micros, PricingConfig};

/// One account (seed 003 §9.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Account {
    pub user_id: String,
    pub plan: String,
    pub compute_minutes_remaining: i64,
    pub compute_minutes_used: i64,
    pub compute_minutes_lifetime: i64,
    pub compute_overtime_charged: Micros,
    pub cash_balance: Micros,
    pub total_credited: Micros,
    /// The plan's monthly minutes plus `compute_quota_adjustment` (never below 0).
    pub compute_quota_monthly: i64,
    /// Minutes an operator added to (or, negative, took from) the plan's monthly quota.
    pub compute_quota_adjustment: i64,
    pub compute_quota_period_start: i64,
    pub compute_quota_period_end: i64,
    pub compute_quota_refreshed_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Account {
    pub fn balance(&self) -> AccountBalance {
        AccountBalance {
            plan: self.plan.clone(),
            compute_minutes_remaining: self.compute_minutes_remaining,
            cash_balance: self.cash_balance,
        }
    }
}

/// Artifact registration state of a usage record (seed 003 §10.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactsState {
    None,
    Pending,
    Registered,
    Unregistered,
}

impl ArtifactsState {
    fn parse(s: &str) -> Result<Self, RegistryError> {
        Ok(match s {
            "none" => ArtifactsState::None,
            "pending" => ArtifactsState::Pending,
            "registered" => ArtifactsState::Registered,
            "unregistered" => ArtifactsState::Unregistered,
            o => return Err(RegistryError::Corrupt(format!("unknown artifacts state {o:?}"))),
        })
    }
}

/// One row of `compute_usage_log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct UsageRecord {
    pub usage_id: i64,
    pub environment_id: String,
    pub user_id: String,
    pub thread_id: String,
    pub runtime_seconds: i64,
    pub compute_minutes: i64,
    /// `pending` or `settled`.
    pub settlement_status: String,
    pub artifacts_state: ArtifactsState,
    pub artifact_attempts: i64,
    pub settle_failures: i64,
    pub settlement_error: Option<String>,
    pub next_attempt_at: Option<i64>,
    pub plan: Option<String>,
    pub free_minutes: Option<i64>,
    pub overtime_minutes: Option<i64>,
    pub overtime_charged: Option<Micros>,
    pub quota_remaining: Option<i64>,
    pub ledger_entry_id: Option<i64>,
    pub created_at: i64,
    pub settled_at: Option<i64>,
    /// The price in force when the environment was admitted (`PricingConfig::snapshot_json`): what
    /// settlement charges; `None` for usage recorded by older versions (charged at the current price).
    pub pricing_snapshot: Option<String>,
}

impl UsageRecord {
    /// Settled here (charged, with its ledger row) or by the gateway (`reported`).
    pub fn is_settled(&self) -> bool {
        self.settlement_status != "pending"
    }
}

/// One row of `wallet_ledger`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct LedgerEntry {
    pub entry_id: i64,
    pub user_id: String,
    pub idempotency_key: String,
    pub entry_type: String,
    pub source_type: String,
    pub source_id: String,
    pub direction: String,
    pub amount: Micros,
    pub balance_after: Micros,
    pub compute_minutes: Option<i64>,
    pub free_minutes: Option<i64>,
    pub currency: String,
    pub pricing_snapshot: Option<String>,
    pub note: Option<String>,
    pub created_at: i64,
}

/// Outcome of a settlement that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SettleStatus {
    Settled,
    AlreadySettled,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub status: SettleStatus,
    pub usage: UsageRecord,
}

/// Whether an account's books agree: ledger, usage log and balances (see `billing_audit`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BillingAudit {
    pub accounts: usize,
    pub settled_usages: usize,
    pub compute_ledger_rows: usize,
    /// Human-readable disagreements; empty when the books agree to the micro-unit.
    pub problems: Vec<String>,
}

const ACCOUNT_COLS: &str = "user_id, plan, compute_minutes_remaining, compute_minutes_used, compute_minutes_lifetime, \
     compute_overtime_charged_micros, cash_balance_micros, total_credited_micros, compute_quota_monthly, \
     compute_quota_period_start, compute_quota_period_end, compute_quota_refreshed_at, created_at, updated_at, \
     compute_quota_adjustment";

fn account_row(r: &Row<'_>) -> crate::registry::db::Result<Account> {
    Ok(Account {
        user_id: r.get(0)?,
        plan: r.get(1)?,
        compute_minutes_remaining: r.get(2)?,
        compute_minutes_used: r.get(3)?,
        compute_minutes_lifetime: r.get(4)?,
        compute_overtime_charged: Micros::from_micros(r.get(5)?),
        cash_balance: Micros::from_micros(r.get(6)?),
        total_credited: Micros::from_micros(r.get(7)?),
        compute_quota_monthly: r.get(8)?,
        compute_quota_period_start: r.get(9)?,
        compute_quota_period_end: r.get(10)?,
        compute_quota_refreshed_at: r.get(11)?,
        created_at: r.get(12)?,
        updated_at: r.get(13)?,
        compute_quota_adjustment: r.get(14)?,
    })
}

const USAGE_COLS: &str = "usage_id, environment_id, user_id, thread_id, runtime_seconds, compute_minutes, \
     settlement_status, artifacts_state, artifact_attempts, settle_failures, settlement_error, next_attempt_at, plan, \
     free_minutes, overtime_minutes, overtime_charged_micros, quota_remaining, ledger_entry_id, created_at, settled_at, \
     pricing_snapshot";

fn usage_row(r: &Row<'_>) -> crate::registry::db::Result<Result<UsageRecord, RegistryError>> {
    let artifacts: String = r.get(7)?;
    let charged: Option<i64> = r.get(15)?;
    let rec = UsageRecord {
        usage_id: r.get(0)?,
        environment_id: r.get(1)?,
        user_id: r.get(2)?,
        thread_id: r.get(3)?,
        runtime_seconds: r.get(4)?,
        compute_minutes: r.get(5)?,
        settlement_status: r.get(6)?,
        artifacts_state: ArtifactsState::None,
        artifact_attempts: r.get(8)?,
        settle_failures: r.get(9)?,
        settlement_error: r.get(10)?,
        next_attempt_at: r.get(11)?,
        plan: r.get(12)?,
        free_minutes: r.get(13)?,
        overtime_minutes: r.get(14)?,
        overtime_charged: charged.map(Micros::from_micros),
        quota_remaining: r.get(16)?,
        ledger_entry_id: r.get(17)?,
        created_at: r.get(18)?,
        settled_at: r.get(19)?,
        pricing_snapshot: r.get(20)?,
    };
    Ok(ArtifactsState::parse(&artifacts).map(|a| UsageRecord { artifacts_state: a, ..rec }))
}

const LEDGER_COLS: &str = "entry_id, user_id, idempotency_key, entry_type, source_type, source_id, direction, \
     amount_micros, balance_after_micros, compute_minutes, free_minutes, currency, pricing_snapshot, note, created_at";

fn ledger_row(r: &Row<'_>) -> crate::registry::db::Result<LedgerEntry> {
    Ok(LedgerEntry {
        entry_id: r.get(0)?,
        user_id: r.get(1)?,
        idempotency_key: r.get(2)?,
        entry_type: r.get(3)?,
        source_type: r.get(4)?,
        source_id: r.get(5)?,
        direction: r.get(6)?,
        amount: Micros::from_micros(r.get(7)?),
        balance_after: Micros::from_micros(r.get(8)?),
        compute_minutes: r.get(9)?,
        free_minutes: r.get(10)?,
        currency: r.get(11)?,
        pricing_snapshot: r.get(12)?,
        note: r.get(13)?,
        created_at: r.get(14)?,
    })
}

fn get_account_in(conn: &Conn<'_>, user: &str) -> Result<Option<Account>, RegistryError> {
    let sql = format!("SELECT {ACCOUNT_COLS} FROM accounts WHERE user_id = ?1");
    Ok(conn.query_row(&sql, [user], account_row).optional()?)
}

fn get_usage_in(conn: &Conn<'_>, usage_id: i64) -> Result<Option<UsageRecord>, RegistryError> {
    let sql = format!("SELECT {USAGE_COLS} FROM compute_usage_log WHERE usage_id = ?1");
    conn.query_row(&sql, [usage_id], usage_row).optional()?.transpose()
}

/// Whether usage record `usage_id` may be settled now, in whichever way (charged here or marked
/// settled by the gateway): `Ok(record)` while pending; `Err(AlreadySettled)` answered as is once
/// settled either way; `ArtifactsPending` while its artifacts wait for registration.
fn settleable_in(conn: &Conn<'_>, usage_id: i64) -> Result<Result<UsageRecord, Settlement>, BillingError> {
    let usage = get_usage_in(conn, usage_id)?.ok_or(BillingError::UsageNotFound)?;
    if usage.is_settled() {
        return Ok(Err(Settlement { status: SettleStatus::AlreadySettled, usage }));
    }
    if usage.artifacts_state == ArtifactsState::Pending {
        return Err(BillingError::ArtifactsPending);
    }
    Ok(Ok(usage))
}

/// The end of a settlement's transaction: its one state transition (`changed` rows) checked, the
/// record read back as settled, the transaction committed.
/// Commits a settlement's transaction (with the audit row of the admin request that made it, if
/// one did) and returns the settled record.
fn commit_settlement(
    tx: Tx<'_, '_>,
    usage_id: i64,
    changed: usize,
    audit: Option<(&AdminAction, i64)>,
) -> Result<Settlement, BillingError> {
    if changed != 1 {
        return Err(RegistryError::Corrupt("usage settlement transition refused".into()).into());
    }
    if let Some((action, now)) = audit {
        admin_audit::record_in(&tx, action, now)?;
    }
    let usage = get_usage_in(&tx, usage_id)?.ok_or(BillingError::UsageNotFound)?;
    tx.commit()?;
    Ok(Settlement { status: SettleStatus::Settled, usage })
}

/// The ledger's debit of one settlement's overtime (idempotent on its key); returns its entry id.
fn insert_overtime_entry_in(
    tx: &Conn<'_>,
    currency: &str,
    usage: &UsageRecord,
    charge: &billing::Charge,
    cash_after: Micros,
    snapshot: &str,
    now: i64,
) -> Result<i64, BillingError> {
    let key = format!("compute:{}:{}:{}", usage.user_id, usage.thread_id, usage.environment_id);
    let id = tx.query_row(
        "INSERT INTO wallet_ledger (user_id, idempotency_key, entry_type, source_type, source_id, direction,
                                    amount_micros, balance_after_micros, compute_minutes, free_minutes, currency,
                                    pricing_snapshot, created_at)
         VALUES (?1, ?2, 'compute_overtime', 'compute_usage', ?3, 'debit', ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         RETURNING entry_id",
        params![
            usage.user_id,
            key,
            usage.environment_id,
            charge.overtime_amount.micros(),
            cash_after.micros(),
            charge.compute_minutes,
            charge.free_minutes,
            currency,
            snapshot,
            now
        ],
        |r| r.get(0),
    )?;
    Ok(id)
}

fn query_usages(
    conn: &Conn<'_>,
    where_sql: &str,
    args: &[&dyn crate::registry::db::ToSql],
) -> Result<Vec<UsageRecord>, RegistryError> {
    let sql = format!("SELECT {USAGE_COLS} FROM compute_usage_log WHERE {where_sql}");
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map(args, usage_row)?;
    let mut out = Vec::new();
    for r in rows {
        out.push(r??);
    }
    Ok(out)
}

/// The account of `user`, created with the default plan if missing, its monthly period refreshed if over.
fn ensure_account_in(conn: &Conn<'_>, pricing: &PricingConfig, user: &str, now: i64) -> Result<Account, RegistryError> {
    if let Some(acc) = get_account_in(conn, user)? {
        if acc.compute_quota_period_end > now {
            return Ok(acc);
        }
        refresh_account_in(conn, pricing, &acc, now)?;
    } else {
        let plan = &pricing.default_plan;
        let monthly = pricing.plan(plan).map(|p| p.monthly_minutes).unwrap_or(0);
        let (start, end) = billing::month_period(now);
        conn.execute(
            "INSERT INTO accounts (user_id, plan, compute_minutes_remaining, compute_quota_monthly,
                                   compute_quota_period_start, compute_quota_period_end, compute_quota_refreshed_at,
                                   created_at, updated_at)
             VALUES (?1, ?2, ?3, ?3, ?4, ?5, ?6, ?6, ?6)",
            params![user, plan, monthly, start, end, now],
        )?;
    }
    get_account_in(conn, user)?.ok_or_else(|| RegistryError::Corrupt("account vanished".into()))
}

/// The monthly minutes of an account on `plan` with `adjustment`: the plan's plus the adjustment,
/// never below 0.
fn monthly_minutes(pricing: &PricingConfig, plan: &str, adjustment: i64) -> i64 {
    pricing.plan(plan).map(|p| p.monthly_minutes).unwrap_or(0).saturating_add(adjustment).max(0)
}

/// Starts the period containing `now`: remaining minutes = the monthly quota, used = 0.
fn refresh_account_in(conn: &Conn<'_>, pricing: &PricingConfig, acc: &Account, now: i64) -> Result<(), RegistryError> {
    let monthly = monthly_minutes(pricing, &acc.plan, acc.compute_quota_adjustment);
    let (start, end) = billing::month_period(now);
    conn.execute(
        "UPDATE accounts SET compute_minutes_remaining = ?1, compute_minutes_used = 0, compute_quota_monthly = ?1,
                compute_quota_period_start = ?2, compute_quota_period_end = ?3, compute_quota_refreshed_at = ?4,
                updated_at = ?4
         WHERE user_id = ?5 AND compute_quota_period_end <= ?4",
        params![monthly, start, end, now, acc.user_id],
    )?;
    Ok(())
}

fn validate_artifact_path(p: &str) -> Result<(), RegistryError> {
    let ok = !p.is_empty() && p.len() <= 4096 && !p.chars().any(char::is_control);
    ok.then_some(()).ok_or(RegistryError::Invalid {
        field: "artifacts",
        reason: "paths must be 1-4096 characters without control characters",
    })
}

/// Records an environment's pending usage and its artifacts inside the caller's transaction;
/// idempotent on `environment_id` (a second call changes nothing but may add artifact paths).
pub(crate) fn record_usage_in(
    conn: &Conn<'_>,
    now: i64,
    user: &str,
    thread: &str,
    environment_id: &str,
    runtime_seconds: u64,
    artifacts: &[String],
) -> Result<(), RegistryError> {
    let minutes = billing::compute_minutes(runtime_seconds);
    let runtime = i64::try_from(runtime_seconds).unwrap_or(i64::MAX);
    let state = if artifacts.is_empty() { "none" } else { "pending" };
    // The price the environment was admitted at goes with its usage (`PricingConfig::price_of`).
    conn.execute(
        "INSERT INTO compute_usage_log (environment_id, user_id, thread_id, runtime_seconds, compute_minutes,
                                        artifacts_state, created_at, pricing_snapshot)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7,
                 (SELECT pricing_snapshot FROM environments WHERE environment_id = ?1))
         ON CONFLICT (environment_id) DO NOTHING",
        params![environment_id, user, thread, runtime, minutes, state, now],
    )?;
    let mut added = 0;
    for path in artifacts {
        added += conn.execute(
            "INSERT INTO artifacts (environment_id, path, created_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (environment_id, path) DO NOTHING",
            params![environment_id, path, now],
        )?;
    }
    if added > 0 {
        conn.execute(
            "UPDATE compute_usage_log SET artifacts_state = 'pending', artifact_attempts = 0
             WHERE environment_id = ?1 AND settlement_status = 'pending' AND artifacts_state IN ('none', 'registered')",
            [environment_id],
        )?;
    }
    Ok(())
}

impl Registry {
    /// Records the pending usage of an ended environment (`runtime_seconds`, artifact paths); idempotent
    /// on `environment_id`. Returns the record.
    pub fn record_usage(
        &self,
        user: &str,
        thread: &str,
        environment_id: &str,
        runtime_seconds: u64,
        artifacts: &[String],
    ) -> Result<UsageRecord, BillingError> {
        validate_key("user_id", user)?;
        validate_key("thread_id", thread)?;
        validate_key("environment_id", environment_id)?;
        artifacts.iter().try_for_each(|p| validate_artifact_path(p))?;
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        record_usage_in(&tx, now, user, thread, environment_id, runtime_seconds, artifacts)?;
        let rec =
            query_usages(&tx, "environment_id = ?1", &[&environment_id])?.pop().ok_or(BillingError::UsageNotFound)?;
        tx.commit()?;
        Ok(rec)
    }

    /// The account of `user`, if it exists.
    pub fn account(&self, user: &str) -> Result<Option<Account>, BillingError> {
        Ok(get_account_in(&self.db.conn()?, user)?)
    }

    /// The account of `user`, created with the default plan (and refreshed) if needed.
    pub fn ensure_account(&self, pricing: &PricingConfig, user: &str) -> Result<Account, BillingError> {
        validate_key("user_id", user)?;
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let acc = ensure_account_in(&tx, pricing, user, now)?;
        tx.commit()?;
        Ok(acc)
    }

    /// One usage record.
    pub fn usage(&self, usage_id: i64) -> Result<Option<UsageRecord>, BillingError> {
        Ok(get_usage_in(&self.db.conn()?, usage_id)?)
    }

    /// The usage record of an environment.
    pub fn usage_by_environment(&self, environment_id: &str) -> Result<Option<UsageRecord>, BillingError> {
        Ok(query_usages(&self.db.conn()?, "environment_id = ?1", &[&environment_id])?.pop())
    }

    /// The price an environment was admitted at (`PricingConfig::snapshot_json`), if recorded.
    pub fn environment_pricing_snapshot(&self, environment_id: &str) -> Result<Option<String>, BillingError> {
        let conn = self.db.conn()?;
        let sql = "SELECT pricing_snapshot FROM environments WHERE environment_id = ?1";
        Ok(conn.query_row(sql, [environment_id], |r| r.get::<_, Option<String>>(0usize)).optional()?.flatten())
    }

    /// Pending usage, least recently attempted first. `due_only`: skip records backing off until later.
    pub fn pending_usage(&self, limit: usize, due_only: bool) -> Result<Vec<UsageRecord>, BillingError> {
        let now = self.now_ms();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let conn = self.db.conn()?;
        Ok(query_usages(
            &conn,
            "settlement_status = 'pending' AND (?1 = 0 OR next_attempt_at IS NULL OR next_attempt_at <= ?2)
             ORDER BY COALESCE(last_attempt_at, 0), usage_id LIMIT ?3",
            &[&i64::from(due_only), &now, &limit],
        )?)
    }

    /// The artifact paths recorded for an environment.
    pub fn usage_artifacts(&self, environment_id: &str) -> Result<Vec<String>, BillingError> {
        let conn = self.db.conn()?;
        let mut stmt = conn.prepare("SELECT path FROM artifacts WHERE environment_id = ?1 ORDER BY path")?;
        let rows = stmt.query_map([environment_id], |r| r.get(0))?;
        Ok(rows.collect::<Result<Vec<String>, _>>()?)
    }

    /// Records a failed artifact registration; at `max_retries` failures the artifacts become
    /// `unregistered` and the usage may be settled. Returns the new state.
    pub fn record_artifact_failure(
        &self,
        usage_id: i64,
        error: &str,
        max_retries: u32,
    ) -> Result<ArtifactsState, BillingError> {
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE compute_usage_log
             SET artifact_attempts = artifact_attempts + 1, artifact_error = ?2, last_attempt_at = ?3,
                 artifacts_state = CASE WHEN artifact_attempts + 1 >= ?4 THEN 'unregistered' ELSE artifacts_state END
             WHERE usage_id = ?1 AND artifacts_state = 'pending' AND settlement_status = 'pending'",
            params![usage_id, truncate(error), now, i64::from(max_retries)],
        )?;
        let rec = get_usage_in(&tx, usage_id)?.ok_or(BillingError::UsageNotFound)?;
        tx.commit()?;
        Ok(rec.artifacts_state)
    }

    /// Records a failed settlement attempt (`code`); after `backoff_after` consecutive failures the
    /// record waits `backoff_ms` before the loop tries it again (`backoff_after == 0`: never waits).
    pub fn record_settle_failure(
        &self,
        usage_id: i64,
        code: &str,
        backoff_after: u32,
        backoff_ms: i64,
    ) -> Result<(), BillingError> {
        let now = self.now_ms();
        let conn = self.db.conn()?;
        conn.execute(
            "UPDATE compute_usage_log
             SET settle_failures = settle_failures + 1, settlement_error = ?2, last_attempt_at = ?3,
                 next_attempt_at = CASE WHEN ?4 > 0 AND settle_failures + 1 >= ?4 THEN CAST(?3 AS BIGINT) + ?5 ELSE NULL END
             WHERE usage_id = ?1 AND settlement_status = 'pending'",
            params![usage_id, truncate(code), now, i64::from(backoff_after), backoff_ms],
        )?;
        Ok(())
    }

    /// Settles one usage record exactly as seed 003 §10.2, in one `BEGIN IMMEDIATE` transaction.
    pub fn settle_usage(&self, pricing: &PricingConfig, usage_id: i64) -> Result<Settlement, BillingError> {
        self.settle_usage_audited(pricing, usage_id, None)
    }

    /// [`Registry::settle_usage`] for an admin request: a settlement it makes is audited in its
    /// transaction.
    pub fn settle_usage_audited(
        &self,
        pricing: &PricingConfig,
        usage_id: i64,
        audit: Option<&AdminAction>,
    ) -> Result<Settlement, BillingError> {
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let usage = match settleable_in(&tx, usage_id)? {
            Ok(pending) => pending,
            Err(settled) => return Ok(settled),
        };
        let acc = ensure_account_in(&tx, pricing, &usage.user_id, now)?;
        // The price the environment was admitted at, not the one in force now.
        let (currency, price) = pricing.price_of(usage.pricing_snapshot.as_deref())?;
        let charge = billing::split_charge(usage.compute_minutes, acc.compute_minutes_remaining, price)?;
        if acc.cash_balance < charge.overtime_amount {
            // Dropping `tx` rolls back everything, including an account created just now.
            return Err(BillingError::InsufficientComputeBalance {
                needed: charge.overtime_amount,
                available: acc.cash_balance,
            });
        }
        let cash_after = acc.cash_balance.checked_sub(charge.overtime_amount).ok_or(BillingError::Overflow)?;
        let charged_total =
            acc.compute_overtime_charged.checked_add(charge.overtime_amount).ok_or(BillingError::Overflow)?;
        let remaining_after = acc.compute_minutes_remaining - charge.free_minutes;
        tx.execute(
            "UPDATE accounts SET compute_minutes_remaining = ?2, cash_balance_micros = ?3,
                    compute_minutes_used = compute_minutes_used + ?4, compute_minutes_lifetime = compute_minutes_lifetime + ?4,
                    compute_overtime_charged_micros = ?5, updated_at = ?6
             WHERE user_id = ?1",
            params![acc.user_id, remaining_after, cash_after.micros(), charge.compute_minutes, charged_total.micros(), now],
        )?;
        billing::failpoint("billing_settle_after_charge");
        let snapshot = usage.pricing_snapshot.clone().unwrap_or_else(|| pricing.snapshot_json(&acc.plan));
        let entry_id = insert_overtime_entry_in(&tx, &currency, &usage, &charge, cash_after, &snapshot, now)?;
        billing::failpoint("billing_settle_after_ledger");
        let n = tx.execute(
            "UPDATE compute_usage_log
             SET settlement_status = 'settled', plan = ?2, free_minutes = ?3, overtime_minutes = ?4,
                 overtime_charged_micros = ?5, quota_remaining = ?6, currency = ?7, pricing_snapshot = ?8,
                 ledger_entry_id = ?9, settled_at = ?10, settlement_error = NULL, next_attempt_at = NULL,
                 last_attempt_at = ?10
             WHERE usage_id = ?1 AND EXISTS (SELECT 1 FROM usage_state_transitions
                                             WHERE from_state = compute_usage_log.settlement_status AND to_state = 'settled')",
            params![
                usage_id,
                acc.plan,
                charge.free_minutes,
                charge.overtime_minutes,
                charge.overtime_amount.micros(),
                remaining_after,
                currency,
                snapshot,
                entry_id,
                now
            ],
        )?;
        commit_settlement(tx, usage_id, n, audit.map(|a| (a, now)))
    }

    /// Ledger entries of `user`, newest first, at most `limit`, older than `before` if given.
    pub fn ledger(&self, user: &str, limit: usize, before: Option<i64>) -> Result<Vec<LedgerEntry>, BillingError> {
        let conn = self.db.conn()?;
        let sql = format!(
            "SELECT {LEDGER_COLS} FROM wallet_ledger WHERE user_id = ?1 AND (CAST(?2 AS BIGINT) IS NULL OR entry_id < ?2)
             ORDER BY entry_id DESC LIMIT ?3"
        );
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(params![user, before, i64::try_from(limit).unwrap_or(i64::MAX)], ledger_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}

/// Error texts stored in the registry are bounded.
fn truncate(s: &str) -> String {
    s.chars().take(500).collect()
}
