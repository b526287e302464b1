//! SQL of account management (seed 003 §9.1): cash credits, plan changes, the operator's
//! `compute_quota_adjustment` and monthly quota refresh.

use crate::registry::db::{params, OptionalExtension};

use super::{
    account_row, ensure_account_in, get_account_in, ledger_row, monthly_minutes, refresh_account_in, truncate, Account,
    LedgerEntry, ACCOUNT_COLS, LEDGER_COLS,
};
use crate::billing::{BillingError, Micros, PricingConfig};
use crate::registry::admin_audit::{self, AdminAction};
use crate::registry::{validate_key, Registry};

/// The largest quota adjustment, in minutes either way (a year of minutes, twice over).
pub const MAX_QUOTA_ADJUSTMENT: i64 = 1_051_200;

impl Registry {
    /// Credits cash to `user` (account created if needed), idempotent on `idempotency_key`: the same
    /// key with the same amount returns the first entry; with another amount it is `CreditConflict`.
    /// A new credit is audited (`admin_audit`) in its transaction.
    pub fn credit_cash(
        &self,
        pricing: &PricingConfig,
        user: &str,
        amount: Micros,
        idempotency_key: &str,
        note: Option<&str>,
    ) -> Result<(Account, LedgerEntry), BillingError> {
        validate_key("user_id", user)?;
        validate_key("idempotency_key", idempotency_key)?;
        if !amount.is_positive() {
            return Err(BillingError::Invalid { field: "amount", reason: "must be greater than 0".into() });
        }
        let now = self.now_ms();
        let key = format!("credit:{user}:{idempotency_key}");
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let existing = tx
            .query_row(
                &format!("SELECT {LEDGER_COLS} FROM wallet_ledger WHERE idempotency_key = ?1"),
                [&key],
                ledger_row,
            )
            .optional()?;
        if let Some(entry) = existing {
            if entry.amount != amount {
                return Err(BillingError::CreditConflict);
            }
            let acc = get_account_in(&tx, user)?.ok_or(BillingError::AccountNotFound)?;
            return Ok((acc, entry));
        }
        let acc = ensure_account_in(&tx, pricing, user, now)?;
        let cash = acc.cash_balance.checked_add(amount).ok_or(BillingError::Overflow)?;
        let credited = acc.total_credited.checked_add(amount).ok_or(BillingError::Overflow)?;
        tx.execute(
            "UPDATE accounts SET cash_balance_micros = ?2, total_credited_micros = ?3, updated_at = ?4 WHERE user_id = ?1",
            params![user, cash.micros(), credited.micros(), now],
        )?;
        let id: i64 = tx.query_row(
            "INSERT INTO wallet_ledger (user_id, idempotency_key, entry_type, source_type, source_id, direction,
                                        amount_micros, balance_after_micros, currency, note, created_at)
             VALUES (?1, ?2, 'credit', 'admin', ?3, 'credit', ?4, ?5, ?6, ?7, ?8)
             RETURNING entry_id",
            params![
                user,
                key,
                idempotency_key,
                amount.micros(),
                cash.micros(),
                pricing.currency,
                note.map(truncate),
                now
            ],
            |r| r.get(0),
        )?;
        // New money: records waiting for it are due again.
        tx.execute(
            "UPDATE compute_usage_log SET next_attempt_at = NULL WHERE user_id = ?1 AND settlement_status = 'pending'",
            [user],
        )?;
        let detail =
            serde_json::json!({"amount": amount.to_string(), "idempotency_key": idempotency_key, "entry_id": id});
        admin_audit::record_in(&tx, &AdminAction { action: admin_audit::CREDIT, subject: user.into(), detail }, now)?;
        let entry =
            tx.query_row(&format!("SELECT {LEDGER_COLS} FROM wallet_ledger WHERE entry_id = ?1"), [id], ledger_row)?;
        let acc = get_account_in(&tx, user)?.ok_or(BillingError::AccountNotFound)?;
        tx.commit()?;
        Ok((acc, entry))
    }

    /// Moves `user` to `plan`: the monthly quota becomes the plan's (plus the account's adjustment),
    /// and the minutes remaining this period `max(0, monthly - used this period)`. Audited.
    pub fn set_plan(&self, pricing: &PricingConfig, user: &str, plan: &str) -> Result<Account, BillingError> {
        validate_key("user_id", user)?;
        pricing.plan(plan).ok_or_else(|| BillingError::UnknownPlan(plan.to_string()))?;
        let detail = serde_json::json!({ "plan": plan });
        let action = AdminAction { action: admin_audit::SET_PLAN, subject: user.into(), detail };
        self.change_quota(pricing, user, &action, |acc| (plan.to_string(), acc.compute_quota_adjustment))
    }

    /// Sets the operator's adjustment of `user`'s monthly quota (seed 003 §9.1
    /// `compute_quota_adjustment`, in minutes, within ±`MAX_QUOTA_ADJUSTMENT`): the monthly quota
    /// becomes `max(0, plan's + adjustment)` from now on, this period's remaining minutes
    /// `max(0, monthly - used this period)`. Audited.
    pub fn set_quota_adjustment(
        &self,
        pricing: &PricingConfig,
        user: &str,
        minutes: i64,
    ) -> Result<Account, BillingError> {
        validate_key("user_id", user)?;
        // `unsigned_abs`: `i64::MIN` has no `abs` (a panic in a debug build, itself in release).
        if minutes.unsigned_abs() > MAX_QUOTA_ADJUSTMENT.unsigned_abs() {
            let reason = format!("must be within ±{MAX_QUOTA_ADJUSTMENT} minutes");
            return Err(BillingError::Invalid { field: "minutes", reason });
        }
        let detail = serde_json::json!({ "minutes": minutes });
        let action = AdminAction { action: admin_audit::SET_QUOTA_ADJUSTMENT, subject: user.into(), detail };
        self.change_quota(pricing, user, &action, |acc| (acc.plan.clone(), minutes))
    }

    /// One plan or adjustment change (`change` gives the new plan and adjustment), recomputing the
    /// monthly quota and this period's remaining minutes, with its audit row, in one transaction.
    fn change_quota(
        &self,
        pricing: &PricingConfig,
        user: &str,
        action: &AdminAction,
        change: impl FnOnce(&Account) -> (String, i64),
    ) -> Result<Account, BillingError> {
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let acc = ensure_account_in(&tx, pricing, user, now)?;
        let (plan, adjustment) = change(&acc);
        let monthly = monthly_minutes(pricing, &plan, adjustment);
        tx.execute(
            "UPDATE accounts SET plan = ?2, compute_quota_adjustment = ?3, compute_quota_monthly = ?4,
                    compute_minutes_remaining = CASE WHEN ?4 > compute_minutes_used THEN ?4 - compute_minutes_used ELSE 0 END, updated_at = ?5
             WHERE user_id = ?1",
            params![user, plan, adjustment, monthly, now],
        )?;
        admin_audit::record_in(&tx, action, now)?;
        let acc = get_account_in(&tx, user)?.ok_or(BillingError::AccountNotFound)?;
        tx.commit()?;
        Ok(acc)
    }

    /// Accounts, most recently changed first, at most `limit` (the admin page's list).
    pub fn accounts(&self, limit: usize) -> Result<Vec<Account>, BillingError> {
        let conn = self.db.conn()?;
        let sql = format!("SELECT {ACCOUNT_COLS} FROM accounts ORDER BY updated_at DESC, user_id LIMIT ?1");
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map([i64::try_from(limit).unwrap_or(i64::MAX)], account_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Starts a new monthly period for every account whose period has ended. Returns how many.
    pub fn refresh_compute_quotas(&self, pricing: &PricingConfig) -> Result<usize, BillingError> {
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let due: Vec<Account> = {
            let mut stmt =
                tx.prepare(&format!("SELECT {ACCOUNT_COLS} FROM accounts WHERE compute_quota_period_end <= ?1"))?;
            let rows = stmt.query_map([now], account_row)?;
            rows.collect::<Result<_, _>>()?
        };
        for acc in &due {
            refresh_account_in(&tx, pricing, acc, now)?;
        }
        tx.commit()?;
        Ok(due.len())
    }
}
