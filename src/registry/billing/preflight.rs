//! The compute preflight against what a user has already committed (review M7).

use crate::registry::db::Conn;

use crate::billing::{after_commitments, compute_minutes, BillingError, Preflight, PricingConfig};
use crate::registry::{Registry, RegistryError};

impl Registry {
    /// Preflight of seed 003 §10.1 for `user` (account created on first use), against the balance
    /// left after what the user has already committed (review M7): the admitted runtime of each of
    /// their live environments, in every scope, and their usage not settled yet. So parallel
    /// environments cannot together run longer than the balance pays for.
    pub fn compute_preflight(
        &self,
        pricing: &PricingConfig,
        user: &str,
        requested_runtime_seconds: Option<u64>,
    ) -> Result<Preflight, BillingError> {
        let acc = self.ensure_account(pricing, user)?;
        let committed = committed_minutes_in(&self.db.conn()?, user)?;
        let balance = after_commitments(&acc.balance(), committed, pricing.overtime_price_per_minute);
        Ok(pricing.preflight(&balance, requested_runtime_seconds))
    }

    /// What `create_environment` calls: the effective max runtime, or `ComputeQuotaExceeded` (429).
    pub fn admit_environment(
        &self,
        pricing: &PricingConfig,
        user: &str,
        requested_runtime_seconds: Option<u64>,
    ) -> Result<u64, BillingError> {
        Ok(self.admit_environment_priced(pricing, user, requested_runtime_seconds)?.0)
    }

    /// [`Registry::admit_environment`] with the price in force for the account
    /// (`PricingConfig::snapshot_json`), which the environment records and its settlement charges.
    pub fn admit_environment_priced(
        &self,
        pricing: &PricingConfig,
        user: &str,
        requested_runtime_seconds: Option<u64>,
    ) -> Result<(u64, String), BillingError> {
        let preflight = self.compute_preflight(pricing, user, requested_runtime_seconds)?;
        let snapshot = pricing.snapshot_json(&preflight.plan);
        Ok((preflight.into_effective(pricing)?, snapshot))
    }
}

/// Minutes `user` has committed and not paid: `compute_minutes(effective max runtime)` of each live
/// (creating or running) environment, plus the minutes of each pending usage record.
fn committed_minutes_in(conn: &Conn<'_>, user: &str) -> Result<i64, RegistryError> {
    let live: Vec<i64> = {
        let mut stmt = conn.prepare(
            "SELECT effective_max_runtime_seconds FROM environments
             WHERE user_id = ?1 AND state IN ('creating', 'running')",
        )?;
        let rows = stmt.query_map([user], |r| r.get::<_, i64>(0))?;
        rows.collect::<Result<_, _>>()?
    };
    let pending: i64 = conn.query_row(
        "SELECT CAST(COALESCE(SUM(compute_minutes), 0) AS BIGINT) FROM compute_usage_log
         WHERE user_id = ?1 AND settlement_status = 'pending'",
        [user],
        |r| r.get(0),
    )?;
    let live_minutes =
        live.into_iter().map(|secs| compute_minutes(u64::try_from(secs).unwrap_or(0))).fold(0i64, i64::saturating_add);
    Ok(live_minutes.saturating_add(pending))
}
