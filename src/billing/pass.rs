//! One round of the pending-usage loop (seed 003 §11.3): register artifacts first, then settle.
//!
//! The timing around it (interval, backoff after consecutive failed rounds, monthly refresh) lives in
//! the daemon; this is the synchronous, testable core. Safe to run in several processes at once:
//! every settlement is one registry transaction that charges at most once.

use std::sync::Arc;
use std::time::Duration;

use super::{BillingError, PricingConfig};
use crate::registry::billing::{ArtifactsState, SettleStatus, UsageRecord};
use crate::registry::Registry;

/// Registers the artifacts of a usage record somewhere (the seed's `storage_service.register_artifacts`).
pub trait ArtifactRegistrar: Send + Sync {
    /// `Err` is a retryable failure, described without paths or contents.
    fn register(&self, usage: &UsageRecord, paths: &[String]) -> Result<(), String>;
}

/// A registrar that registers nothing and always succeeds (tests of settlement alone).
#[derive(Debug, Default, Clone, Copy)]
pub struct RecordOnlyRegistrar;

impl ArtifactRegistrar for RecordOnlyRegistrar {
    fn register(&self, _usage: &UsageRecord, _paths: &[String]) -> Result<(), String> {
        Ok(())
    }
}

/// The production registrar: the registry's `artifacts` table is the artifact registry of this
/// daemon, so registering stamps each manifest row of the usage's environment `registered_at`
/// (idempotent). A registry failure is a retryable registration failure.
pub struct RegistryRegistrar {
    registry: Arc<Registry>,
}

impl RegistryRegistrar {
    pub fn new(registry: Arc<Registry>) -> RegistryRegistrar {
        RegistryRegistrar { registry }
    }
}

impl ArtifactRegistrar for RegistryRegistrar {
    fn register(&self, usage: &UsageRecord, _paths: &[String]) -> Result<(), String> {
        self.registry.stamp_artifacts_registered(&usage.environment_id).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// Parameters of seed 003 §11.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassSettings {
    pub batch_size: usize,
    pub artifact_max_retries: u32,
    /// Consecutive failures (of a round, or of one record's settlement) before backing off.
    pub failure_threshold: u32,
    pub backoff: Duration,
}

impl Default for PassSettings {
    fn default() -> Self {
        PassSettings {
            batch_size: 50,
            artifact_max_retries: 10,
            failure_threshold: 5,
            backoff: Duration::from_secs(600),
        }
    }
}

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    pub listed: usize,
    pub settled: usize,
    pub already_settled: usize,
    pub artifacts_registered: usize,
    pub artifact_failures: usize,
    pub artifacts_given_up: usize,
    pub insufficient_balance: usize,
    pub errors: usize,
}

impl PassReport {
    /// Whether the round changed anything.
    pub fn progressed(&self) -> bool {
        self.settled + self.artifacts_registered + self.artifacts_given_up > 0
    }
}

/// One round: lists up to `batch_size` due pending records and handles each (§11.3 step 3).
/// `Err` only when the list itself fails (the caller counts consecutive failures).
pub fn run_pending_pass(
    registry: &Registry,
    pricing: &PricingConfig,
    registrar: &dyn ArtifactRegistrar,
    settings: &PassSettings,
) -> Result<PassReport, BillingError> {
    let records = registry.pending_usage(settings.batch_size, true)?;
    let mut report = PassReport { listed: records.len(), ..PassReport::default() };
    let backoff_ms = i64::try_from(settings.backoff.as_millis()).unwrap_or(i64::MAX);
    for rec in records {
        if rec.artifacts_state == ArtifactsState::Pending {
            let outcome = registry
                .usage_artifacts(&rec.environment_id)
                .map_err(|e| e.to_string())
                .and_then(|paths| registrar.register(&rec, &paths));
            match outcome {
                Ok(()) => {
                    registry.mark_artifacts_registered(&[rec.usage_id])?;
                    report.artifacts_registered += 1;
                }
                Err(e) => {
                    report.artifact_failures += 1;
                    tracing::warn!(usage_id = rec.usage_id, environment_id = %rec.environment_id, error = %e, "artifact registration failed");
                    match registry.record_artifact_failure(rec.usage_id, &e, settings.artifact_max_retries)? {
                        ArtifactsState::Unregistered => {
                            report.artifacts_given_up += 1;
                            tracing::error!(
                                usage_id = rec.usage_id,
                                "artifact registration retries exhausted; settling with artifacts unregistered"
                            );
                        }
                        _ => continue,
                    }
                }
            }
        }
        match registry.settle_usage(pricing, rec.usage_id) {
            Ok(s) if s.status == SettleStatus::Settled => report.settled += 1,
            Ok(_) => report.already_settled += 1,
            Err(BillingError::InsufficientComputeBalance { .. }) => {
                report.insufficient_balance += 1;
                // Waits for a credit (which makes it due again); no backoff growth needed.
                registry.record_settle_failure(rec.usage_id, "insufficient_compute_balance", 0, 0)?;
            }
            // Another settler changed it between list and settle: next round.
            Err(BillingError::ArtifactsPending) => {}
            Err(e) => {
                report.errors += 1;
                tracing::error!(usage_id = rec.usage_id, error = %e, "settlement failed");
                let code = match &e {
                    BillingError::Registry(_) => "registry_error",
                    _ => "settlement_error",
                };
                registry.record_settle_failure(rec.usage_id, code, settings.failure_threshold, backoff_ms)?;
            }
        }
    }
    Ok(report)
}
