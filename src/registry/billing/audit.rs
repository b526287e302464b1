//! The billing audit: balances, ledger and usage log checked against each other.

use super::{account_row, Account, BillingAudit, ACCOUNT_COLS};
use crate::billing::BillingError;
use crate::registry::Registry;

impl Registry {
    /// Checks that balances, ledger and usage log agree to the micro-unit for every account:
    /// cash = credited − compute debits; overtime charged = compute debits = Σ settled overtime;
    /// lifetime minutes = Σ settled minutes; each settled usage has exactly its one ledger row and
    /// no pending usage has one.
    pub fn billing_audit(&self) -> Result<BillingAudit, BillingError> {
        let conn = self.db.conn()?;
        let mut audit = BillingAudit::default();
        let accounts: Vec<Account> = {
            let mut stmt = conn.prepare(&format!("SELECT {ACCOUNT_COLS} FROM accounts ORDER BY user_id"))?;
            let rows = stmt.query_map([], account_row)?;
            rows.collect::<Result<_, _>>()?
        };
        audit.accounts = accounts.len();
        for a in &accounts {
            let (credits, debits, compute_rows): (i64, i64, i64) = conn.query_row(
                "SELECT CAST(COALESCE(SUM(CASE WHEN direction = 'credit' THEN amount_micros END), 0) AS BIGINT),
                        CAST(COALESCE(SUM(CASE WHEN direction = 'debit' THEN amount_micros END), 0) AS BIGINT),
                        COUNT(CASE WHEN entry_type = 'compute_overtime' THEN 1 END)
                 FROM wallet_ledger WHERE user_id = ?1",
                [&a.user_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            let (settled, minutes, overtime): (i64, i64, i64) = conn.query_row(
                "SELECT COUNT(*), CAST(COALESCE(SUM(compute_minutes), 0) AS BIGINT), CAST(COALESCE(SUM(overtime_charged_micros), 0) AS BIGINT)
                 FROM compute_usage_log WHERE user_id = ?1 AND settlement_status = 'settled'",
                [&a.user_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            let u = &a.user_id;
            let mut check = |ok: bool, what: String| {
                if !ok {
                    audit.problems.push(format!("{u}: {what}"));
                }
            };
            check(
                a.total_credited.micros() == credits,
                format!("credited {} != ledger credits {credits}", a.total_credited.micros()),
            );
            check(
                a.cash_balance.micros() == credits - debits,
                format!("cash {} != credits - debits {}", a.cash_balance.micros(), credits - debits),
            );
            check(
                a.compute_overtime_charged.micros() == debits,
                format!("overtime charged {} != debits {debits}", a.compute_overtime_charged.micros()),
            );
            check(overtime == debits, format!("usage overtime {overtime} != debits {debits}"));
            check(
                a.compute_minutes_lifetime == minutes,
                format!("lifetime minutes {} != settled minutes {minutes}", a.compute_minutes_lifetime),
            );
            check(settled == compute_rows, format!("settled usages {settled} != compute ledger rows {compute_rows}"));
            audit.settled_usages += usize::try_from(settled).unwrap_or(0);
            audit.compute_ledger_rows += usize::try_from(compute_rows).unwrap_or(0);
        }
        let mismatched: i64 = conn.query_row(
            "SELECT COUNT(*) FROM compute_usage_log u
             WHERE (u.settlement_status = 'settled') != EXISTS (
                 SELECT 1 FROM wallet_ledger l
                 WHERE l.idempotency_key = 'compute:' || u.user_id || ':' || u.thread_id || ':' || u.environment_id
                   AND l.entry_id = COALESCE(u.ledger_entry_id, l.entry_id))",
            [],
            |r| r.get(0),
        )?;
        if mismatched != 0 {
            audit.problems.push(format!("{mismatched} usage records disagree with the ledger about being settled"));
        }
        // The artifact registry agrees with the usage log: a usage whose artifacts are registered
        // has every manifest row registered (settlement itself refuses pending artifacts).
        let unregistered: i64 = conn.query_row(
            "SELECT COUNT(*) FROM compute_usage_log u JOIN artifacts a ON a.environment_id = u.environment_id
             WHERE u.artifacts_state = 'registered' AND a.registered_at IS NULL",
            [],
            |r| r.get(0),
        )?;
        if unregistered != 0 {
            audit.problems.push(format!("{unregistered} artifacts disagree with their usage about being registered"));
        }
        Ok(audit)
    }
}
