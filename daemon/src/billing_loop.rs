//! The billing service of the daemon and its background loops: the pending-usage loop of seed 003 §11
//! (every `pricing.settle_interval_secs`, batch 50, back off after 5 consecutive failed rounds,
//! artifacts before settlement with 10 registration retries) and the monthly quota refresh. With
//! `[billing] mode = "report"` the gateway is the billing authority: the loop settles nothing and
//! `/admin/mark-settled` only marks ([`BillingService::mark_settled`]).

use std::sync::Arc;
use std::time::Duration;

use scopefs::billing::{
    run_pending_pass, ArtifactRegistrar, BillingError, PassSettings, PricingConfig, RegistryRegistrar,
};
use scopefs::config::BillingMode;
use scopefs::registry::admin_audit::{self, AdminAction};
use scopefs::registry::billing::Settlement;
use scopefs::registry::Registry;

/// Registry plus pricing: what the admin routes, the loops and `create_environment` need.
pub struct BillingService {
    pub registry: Arc<Registry>,
    pub pricing: PricingConfig,
    pub settings: PassSettings,
    pub registrar: Arc<dyn ArtifactRegistrar>,
    /// Who charges (`[billing] mode`).
    pub mode: BillingMode,
}

impl BillingService {
    /// The daemon's billing; says at startup which plan new accounts get (WARN when it does not
    /// allow compute: every new user's `create_environment` is then a 429 naming it).
    pub fn new(registry: Arc<Registry>, pricing: PricingConfig) -> BillingService {
        let notice = pricing.default_plan_notice();
        if pricing.default_plan_allows_compute() {
            tracing::info!(default_plan = %pricing.default_plan, "{notice}");
        } else {
            tracing::warn!(default_plan = %pricing.default_plan, "{notice}");
        }
        BillingService {
            // The `artifacts` table is the artifact registry of this daemon.
            registrar: Arc::new(RegistryRegistrar::new(registry.clone())),
            registry,
            pricing,
            settings: PassSettings::default(),
            mode: BillingMode::default(),
        }
    }

    /// The same service with `mode` as configured (said at startup).
    pub fn with_mode(mut self, mode: BillingMode) -> BillingService {
        if mode == BillingMode::Report {
            tracing::info!(
                "billing.mode = \"report\": this daemon records usage and never charges; the gateway settles"
            );
        }
        self.mode = mode;
        self
    }

    /// `/admin/mark-settled` of one record: settled now (charged at most once) in settle mode,
    /// marked settled by the gateway (no charge) in report mode; audited when it changes the record.
    pub fn mark_settled(&self, usage_id: i64) -> Result<Settlement, BillingError> {
        let mode = match self.mode {
            BillingMode::Settle => "settle",
            BillingMode::Report => "report",
        };
        let audit = AdminAction {
            action: admin_audit::MARK_SETTLED,
            subject: format!("usage:{usage_id}"),
            detail: serde_json::json!({ "usage_id": usage_id, "billing_mode": mode }),
        };
        match self.mode {
            BillingMode::Settle => self.registry.settle_usage_audited(&self.pricing, usage_id, Some(&audit)),
            BillingMode::Report => self.registry.mark_usage_reported_audited(usage_id, Some(&audit)),
        }
    }

    /// Registers artifacts through `registrar` instead (a test's failing one, another store's).
    pub fn with_registrar(mut self, registrar: Arc<dyn ArtifactRegistrar>) -> BillingService {
        self.registrar = registrar;
        self
    }

    /// Preflight for `create_environment`: the effective max runtime and the price the environment
    /// will be charged at, or `ComputeQuotaExceeded` (429).
    pub fn admit_environment(
        &self,
        user_id: &str,
        requested_runtime_seconds: Option<u64>,
    ) -> Result<(u64, String), BillingError> {
        self.registry.admit_environment_priced(&self.pricing, user_id, requested_runtime_seconds)
    }

    /// What a live environment would be charged if it ended at `now_ms` (the admin page's "cost so
    /// far"): its runtime in billed minutes, split between the account's free minutes and cash at
    /// the price it was admitted at (`split_charge`, as settlement does). The currency with it.
    pub fn cost_so_far(
        &self,
        env: &scopefs::registry::environments::EnvironmentRecord,
        now_ms: i64,
    ) -> Result<(String, scopefs::billing::Charge), BillingError> {
        let started = env.started_at.unwrap_or(env.created_at);
        let runtime = u64::try_from(now_ms.saturating_sub(started) / 1000).unwrap_or(0);
        let snapshot = self.registry.environment_pricing_snapshot(&env.environment_id)?;
        let (currency, price) = self.pricing.price_of(snapshot.as_deref())?;
        let remaining = self.registry.account(&env.user_id)?.map_or(0, |a| a.compute_minutes_remaining);
        let charge = scopefs::billing::split_charge(scopefs::billing::compute_minutes(runtime), remaining, price)?;
        Ok((currency, charge))
    }

    fn interval(&self) -> Duration {
        Duration::from_secs(self.pricing.settle_interval_secs.max(1))
    }
}

/// How often periods are checked for rollover.
const REFRESH_INTERVAL: Duration = Duration::from_secs(300);

/// Runs the pending-usage loop and the quota refresh until `stop` turns true.
pub async fn run(billing: Arc<BillingService>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut failures: u32 = 0;
    let mut last_refresh: Option<tokio::time::Instant> = None;
    loop {
        if last_refresh.is_none_or(|t| t.elapsed() >= REFRESH_INTERVAL) {
            last_refresh = Some(tokio::time::Instant::now());
            let b = billing.clone();
            match tokio::task::spawn_blocking(move || b.registry.refresh_compute_quotas(&b.pricing)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => tracing::info!(accounts = n, "monthly compute quotas refreshed"),
                Ok(Err(e)) => tracing::error!(error = %e, "quota refresh failed"),
                Err(e) => tracing::error!(error = %e, "quota refresh panicked"),
            }
        }
        if billing.mode == BillingMode::Report {
            // The gateway registers artifacts and settles; nothing here charges.
            tokio::select! {
                _ = tokio::time::sleep(billing.interval()) => continue,
                _ = stop.wait_for(|s| *s) => return,
            }
        }
        let b = billing.clone();
        let round = tokio::task::spawn_blocking(move || {
            run_pending_pass(&b.registry, &b.pricing, b.registrar.as_ref(), &b.settings)
        })
        .await;
        match round {
            Ok(Ok(report)) => {
                failures = 0;
                if report.listed > 0 {
                    tracing::info!(?report, "pending usage round");
                }
            }
            Ok(Err(e)) => {
                failures += 1;
                tracing::error!(error = %e, failures, "pending usage round failed");
            }
            Err(e) => {
                failures += 1;
                tracing::error!(error = %e, failures, "pending usage round panicked");
            }
        }
        let wait = if failures >= billing.settings.failure_threshold {
            tracing::warn!(failures, "backing off the pending usage loop");
            failures = 0;
            billing.settings.backoff
        } else {
            billing.interval()
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
