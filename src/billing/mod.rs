//! Compute billing (seed 003 §9–§11): exact money (`Micros`), pricing configuration, the preflight
//! quota check, compute-minute arithmetic and the pending-usage pass.
//!
//! Money is an `i64` count of micro-units (NUMERIC(12,6) semantics); it crosses the wire only as a
//! decimal string such as `"10.000000"`. Floats never touch money. The SQL lives in
//! `registry::billing`; this module holds the arithmetic and the types both sides share.

pub mod money;
pub mod pass;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use money::{Micros, MoneyError};
pub use pass::{run_pending_pass, ArtifactRegistrar, PassReport, PassSettings, RecordOnlyRegistrar, RegistryRegistrar};

use crate::registry::RegistryError;

/// Failures of billing, above the registry.
#[derive(Debug, thiserror::Error)]
pub enum BillingError {
    /// Preflight refused: the account cannot run an environment for a minute (seed 003 §10.1).
    /// The text names the plan and the configuration key that decides it.
    #[error("compute quota exceeded: {0}")]
    ComputeQuotaExceeded(String),
    /// Settlement refused: the cash balance cannot pay the overtime (seed 003 §10.2 step 8).
    #[error("insufficient compute balance: overtime {needed} exceeds cash balance {available}")]
    InsufficientComputeBalance { needed: Micros, available: Micros },
    /// Settlement refused: the usage's artifacts are not registered yet (seed 003 §10.3).
    #[error("artifacts of this usage are not registered yet")]
    ArtifactsPending,
    #[error("no such usage record")]
    UsageNotFound,
    #[error("no such account")]
    AccountNotFound,
    #[error("unknown plan {0:?}")]
    UnknownPlan(String),
    #[error("the idempotency key was already used for a different credit")]
    CreditConflict,
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("money arithmetic overflow")]
    Overflow,
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl From<crate::registry::db::DbError> for BillingError {
    fn from(e: crate::registry::db::DbError) -> Self {
        BillingError::Registry(RegistryError::Db(e))
    }
}

impl From<MoneyError> for BillingError {
    fn from(e: MoneyError) -> Self {
        match e {
            MoneyError::Overflow => BillingError::Overflow,
            other => BillingError::Invalid { field: "amount", reason: other.to_string() },
        }
    }
}

/// One plan of the pricing configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PlanConfig {
    /// Whether accounts on this plan may run environments at all (`starter`: no).
    pub compute_allowed: bool,
    /// Free compute minutes granted at each monthly period start.
    pub monthly_minutes: i64,
    /// Longest runtime one environment may have on this plan.
    pub hard_max_runtime_seconds: u64,
}

/// `[pricing]`: currency, version, overtime price and plans (SPEC §9).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct PricingConfig {
    pub currency: String,
    pub pricing_version: String,
    /// Price of one overtime minute, a decimal string; must be > 0.
    pub overtime_price_per_minute: Micros,
    pub plans: BTreeMap<String, PlanConfig>,
    /// Plan of accounts created on first use.
    pub default_plan: String,
    /// Interval of the pending-usage loop, seconds (seed 003 §11.2: 60).
    pub settle_interval_secs: u64,
}

impl Default for PricingConfig {
    fn default() -> Self {
        let mut plans = BTreeMap::new();
        plans.insert(
            "starter".to_string(),
            PlanConfig { compute_allowed: false, monthly_minutes: 0, hard_max_runtime_seconds: 0 },
        );
        plans.insert(
            "pro".to_string(),
            PlanConfig { compute_allowed: true, monthly_minutes: 120, hard_max_runtime_seconds: 7200 },
        );
        PricingConfig {
            currency: "CNY".into(),
            pricing_version: "2026-05-23".into(),
            overtime_price_per_minute: Micros::from_micros(50_000),
            plans,
            default_plan: "starter".into(),
            settle_interval_secs: 60,
        }
    }
}

/// A pricing configuration error (`PricingConfigError` of seed 003 §10.1): the key and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PricingInvalid {
    pub key: &'static str,
    pub reason: String,
}

impl PricingConfig {
    /// Refuses a configuration compute cannot be billed with, naming the key.
    pub fn validate(&self) -> Result<(), PricingInvalid> {
        let bad = |key, reason: &str| Err(PricingInvalid { key, reason: reason.into() });
        if !self.overtime_price_per_minute.is_positive() {
            return bad("pricing.overtime_price_per_minute", "must be a decimal string greater than 0");
        }
        if self.currency.trim().is_empty() {
            return bad("pricing.currency", "must be set");
        }
        if self.pricing_version.trim().is_empty() {
            return bad("pricing.pricing_version", "must be set");
        }
        if !self.plans.contains_key(&self.default_plan) {
            return bad("pricing.default_plan", "must name a plan of pricing.plans");
        }
        if self.plans.values().any(|p| p.monthly_minutes < 0) {
            return bad("pricing.plans", "monthly_minutes must not be negative");
        }
        if self.settle_interval_secs == 0 {
            return bad("pricing.settle_interval_secs", "must be at least 1");
        }
        Ok(())
    }

    pub fn plan(&self, name: &str) -> Option<&PlanConfig> {
        self.plans.get(name)
    }

    /// Whether accounts created on first use may run compute (the default plan allows it).
    pub fn default_plan_allows_compute(&self) -> bool {
        self.plan(&self.default_plan).is_some_and(|p| p.compute_allowed)
    }

    /// One line saying which plan new accounts get and whether it allows compute (startup log).
    pub fn default_plan_notice(&self) -> String {
        let plan = &self.default_plan;
        if self.default_plan_allows_compute() {
            format!("new accounts get plan {plan:?} (pricing.default_plan), which allows compute")
        } else {
            format!(
                "new accounts get plan {plan:?} (pricing.default_plan), which does NOT allow compute: \
                 create_environment answers 429 compute_quota_exceeded until an operator sets another plan \
                 (PUT /admin/accounts/{{user_id}}/plan) or pricing.default_plan names a plan with \
                 compute_allowed = true; see README \"Billing\""
            )
        }
    }

    /// The preflight of an account under this configuration (an unknown plan allows nothing).
    pub fn preflight(&self, account: &AccountBalance, requested_runtime_seconds: Option<u64>) -> Preflight {
        const NONE: PlanConfig = PlanConfig { compute_allowed: false, monthly_minutes: 0, hard_max_runtime_seconds: 0 };
        let plan = self.plan(&account.plan).unwrap_or(&NONE);
        preflight(account, plan, self.overtime_price_per_minute, requested_runtime_seconds)
    }

    /// The snapshot stored with a settlement (JSON text).
    /// The currency and overtime price a usage is charged at: those of its `pricing_snapshot`,
    /// taken when its environment was admitted (seed 003 §9.2: settle with the usage's snapshot, not
    /// with whatever `[pricing]` says at settlement); without one (usage recorded by an older
    /// version), the current ones. A snapshot that does not read back is refused, never guessed.
    pub fn price_of(&self, snapshot: Option<&str>) -> Result<(String, Micros), BillingError> {
        let Some(text) = snapshot else {
            return Ok((self.currency.clone(), self.overtime_price_per_minute));
        };
        let corrupt = |why: &str| BillingError::Invalid { field: "pricing_snapshot", reason: why.to_string() };
        let v: serde_json::Value = serde_json::from_str(text).map_err(|_| corrupt("not JSON"))?;
        let currency = v.get("currency").and_then(|c| c.as_str()).ok_or_else(|| corrupt("no currency"))?;
        let price = v.get("overtime_price_per_minute").and_then(|p| p.as_str()).ok_or_else(|| corrupt("no price"))?;
        Ok((currency.to_string(), Micros::parse(price)?))
    }

    /// The price in force for an account on `plan`, as JSON: recorded with an environment when it is
    /// admitted, copied to its usage, charged from at settlement and kept on the ledger row.
    pub fn snapshot_json(&self, plan: &str) -> String {
        serde_json::json!({
            "plan": plan,
            "currency": self.currency,
            "pricing_version": self.pricing_version,
            "overtime_price_per_minute": self.overtime_price_per_minute.to_string(),
        })
        .to_string()
    }
}

/// What preflight needs of an account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountBalance {
    pub plan: String,
    pub compute_minutes_remaining: i64,
    pub cash_balance: Micros,
}

/// The preflight result (seed 003 §10.1) and the budget snapshot of seed 003 §5.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Preflight {
    pub plan: String,
    pub quota_ok: bool,
    pub remaining_minutes: i64,
    pub cash_balance_snapshot: Micros,
    pub overtime_price_per_minute: Micros,
    pub affordable_runtime_seconds: u64,
    /// `min(requested, plan hard max, affordable)`; 0 when `quota_ok` is false.
    pub effective_max_runtime_seconds: u64,
}

/// The shortest runtime preflight admits: under one minute is `compute_quota_exceeded`.
pub const MIN_ADMITTED_RUNTIME_SECONDS: u64 = 60;

impl Preflight {
    /// Whether an environment may be created: quota ok and at least one minute of runtime.
    pub fn admitted(&self) -> bool {
        self.quota_ok && self.effective_max_runtime_seconds >= MIN_ADMITTED_RUNTIME_SECONDS
    }

    /// The effective max runtime, or `ComputeQuotaExceeded` (429) when not admitted; the refusal
    /// names the account's plan and the `[pricing]` key behind it, so nobody gets a silent 429.
    pub fn into_effective(self, pricing: &PricingConfig) -> Result<u64, BillingError> {
        let plan = &self.plan;
        if !self.quota_ok {
            let allowed = pricing.plan(plan).is_some_and(|p| p.compute_allowed);
            let why = if allowed {
                format!(
                    "plan {plan:?} has no compute minutes left and the cash balance is below one minute                      (pricing.overtime_price_per_minute)"
                )
            } else {
                format!(
                    "plan {plan:?} does not allow compute (pricing.plans.{plan}.compute_allowed; new accounts get                      pricing.default_plan = {:?}); an operator sets another plan with PUT /admin/accounts/{{user_id}}/plan",
                    pricing.default_plan
                )
            };
            return Err(BillingError::ComputeQuotaExceeded(why));
        }
        if self.effective_max_runtime_seconds < MIN_ADMITTED_RUNTIME_SECONDS {
            return Err(BillingError::ComputeQuotaExceeded(format!(
                "the effective max runtime on plan {plan:?} is below one minute                  (pricing.plans.{plan}.hard_max_runtime_seconds, or the balance)"
            )));
        }
        Ok(self.effective_max_runtime_seconds)
    }
}

/// Preflight exactly as seed 003 §10.1:
/// `quota_ok = compute allowed and (minutes_remaining > 0 or cash >= price)`;
/// `affordable = (minutes_remaining + floor(cash / price)) * 60`;
/// negative minutes or cash: logged as an error, `quota_ok = false`;
/// `effective = min(requested, plan hard max, affordable)` (requested absent: the plan maximum).
pub fn preflight(account: &AccountBalance, plan: &PlanConfig, price: Micros, requested: Option<u64>) -> Preflight {
    let minutes = account.compute_minutes_remaining;
    let cash = account.cash_balance;
    let negative = minutes < 0 || cash.is_negative();
    if negative {
        tracing::error!(plan = %account.plan, "account has negative compute minutes or cash balance; compute refused");
    }
    let price_ok = price.is_positive();
    let quota_ok = plan.compute_allowed && price_ok && !negative && (minutes > 0 || cash.micros() >= price.micros());
    let affordable = if negative || !price_ok {
        0
    } else {
        let cash_minutes = cash.micros() / price.micros();
        let total = u64::try_from(minutes.saturating_add(cash_minutes)).unwrap_or(0);
        total.saturating_mul(60)
    };
    let effective = if quota_ok {
        requested.unwrap_or(plan.hard_max_runtime_seconds).min(plan.hard_max_runtime_seconds).min(affordable)
    } else {
        0
    };
    Preflight {
        plan: account.plan.clone(),
        quota_ok,
        remaining_minutes: minutes,
        cash_balance_snapshot: cash,
        overtime_price_per_minute: price,
        affordable_runtime_seconds: affordable,
        effective_max_runtime_seconds: effective,
    }
}

/// The balance left once `committed` minutes (live environments' admitted runtime, unsettled
/// usage) are paid: free minutes first, then cash at `price` per minute; never below zero (an
/// account that cannot cover its commitments has nothing left, it is not "negative").
pub fn after_commitments(balance: &AccountBalance, committed: i64, price: Micros) -> AccountBalance {
    let committed = committed.max(0);
    let minutes = balance.compute_minutes_remaining;
    let from_minutes = committed.min(minutes.max(0));
    let from_cash = committed - from_minutes;
    let cash = if from_cash == 0 || balance.cash_balance.is_negative() {
        balance.cash_balance
    } else {
        price
            .checked_mul(from_cash)
            .and_then(|owed| balance.cash_balance.checked_sub(owed))
            .filter(|left| !left.is_negative())
            .unwrap_or(Micros::ZERO)
    };
    AccountBalance { plan: balance.plan.clone(), compute_minutes_remaining: minutes - from_minutes, cash_balance: cash }
}

/// Billed minutes of a runtime: `max(1, ceil(runtime_seconds / 60))`.
pub fn compute_minutes(runtime_seconds: u64) -> i64 {
    i64::try_from(runtime_seconds.div_ceil(60).max(1)).unwrap_or(i64::MAX)
}

/// How one usage splits between free minutes and cash (seed 003 §10.2 steps 5–7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub compute_minutes: i64,
    pub free_minutes: i64,
    pub overtime_minutes: i64,
    pub overtime_amount: Micros,
}

/// `free = min(remaining, minutes)`, `overtime = minutes - free`, `amount = overtime * price`.
/// Negative remaining minutes grant nothing.
pub fn split_charge(compute_minutes: i64, minutes_remaining: i64, price: Micros) -> Result<Charge, BillingError> {
    let free = minutes_remaining.max(0).min(compute_minutes);
    let overtime = compute_minutes - free;
    let amount = price.checked_mul(overtime).ok_or(BillingError::Overflow)?;
    Ok(Charge { compute_minutes, free_minutes: free, overtime_minutes: overtime, overtime_amount: amount })
}

/// Failpoints of the settlement (crash tests only): see [`crate::testhooks`].
pub use crate::testhooks::failpoint;

/// Start of the calendar month (UTC) containing `ms`, and the start of the next one, in Unix ms.
pub fn month_period(ms: i64) -> (i64, i64) {
    let days = ms.div_euclid(86_400_000);
    let (y, m, _) = civil_from_days(days);
    let start = days_from_civil(y, m, 1) * 86_400_000;
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    (start, days_from_civil(ny, nm, 1) * 86_400_000)
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests;
