//! Saga recovery of `Scopes` (seed 000 §5.3) and the required-mode cutover gate (§11.1).
//!
//! Recovery is driven by the registry's open operations, not by scope states: each one is finished
//! forward when its scope still allows it, or compensated — `compensating` is recorded, what the
//! operation did is undone, and it ends `compensated`:
//! - `provision`: a `provisioning` scope is mounted and becomes `draft`; one that still cannot be
//!   finished after the draft TTL is compensated (its mount and local data are removed, the scope
//!   becomes `deleted`); a scope that went another way only has the record compensated.
//! - `delete` / `purge`: retried while the scope is `deleting` / `deleted`, else compensated.
//! - `run` / `cron`: left to their caller while the scope is open; once the scope is being deleted
//!   or gone, a reservation that never started is cancelled and a cron that never became active is
//!   settled, which releases the delete.
//!
//! Every step is idempotent, so a crash between any two is finished by the next pass (at startup,
//! then by every maintenance pass).

use std::io::Read;
use std::path::PathBuf;

use scopefs::config::{Config, CutoverMode};
use scopefs::ids::ThreadId;
use scopefs::registry::{
    DeleteStep, OperationRecord, OperationState, RunRequestState, ScopeRecord, ScopeState, CRON_KIND, DELETE_KIND,
    PROVISION_KIND, PURGE_KIND, RUN_KIND,
};
use sha2::{Digest, Sha256};

use super::{failpoint, Scopes, ServiceError};

/// Largest migration report read (the report is the operator's file, a few KiB in practice).
const MAX_REPORT_BYTES: u64 = 16 << 20;

/// The cutover gate (config `[cutover]`): in `required` mode a thread without a scope is only
/// provisioned once the migration report checks out.
#[derive(Debug, Clone, Default)]
pub struct CutoverGate {
    mode: CutoverMode,
    report: Option<PathBuf>,
    deployment_id: String,
}

impl CutoverGate {
    pub fn from_config(cfg: &Config) -> Self {
        CutoverGate {
            mode: cfg.cutover.mode,
            report: cfg.cutover.report.clone(),
            deployment_id: cfg.deployment_id.clone(),
        }
    }
}

/// What one recovery pass over the open operations did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OperationsReport {
    /// Operations whose forward step had been done: only the record was completed.
    pub completed: usize,
    /// Operations finished forward now (a provisioning mounted, a purge redone).
    pub resumed: usize,
    pub compensated: usize,
    /// Deletes finished now / still waiting for owners.
    pub deleted: usize,
    pub still_deleting: usize,
    /// Open operations left to their caller (a run or cron in an open scope).
    pub waiting: usize,
    pub failed: usize,
}

enum Outcome {
    Completed,
    Resumed,
    Compensated,
    Deleted,
    StillDeleting,
    Waiting,
}

impl OperationsReport {
    fn count(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Completed => self.completed += 1,
            Outcome::Resumed => self.resumed += 1,
            Outcome::Compensated => self.compensated += 1,
            Outcome::Deleted => self.deleted += 1,
            Outcome::StillDeleting => self.still_deleting += 1,
            Outcome::Waiting => self.waiting += 1,
        }
    }
}

impl Scopes {
    /// Finishes or compensates every open operation (see the module docs); a failure is logged per
    /// operation, counted, and retried by the next pass.
    pub fn recover_operations(&self) -> Result<OperationsReport, ServiceError> {
        self.recover_operations_untouched_since(None)
    }

    /// Like `recover_operations`, but only for operations not updated since `cutoff_ms` (when
    /// given): the maintenance pass leaves alone the ones a request is driving right now.
    pub(super) fn recover_operations_untouched_since(
        &self,
        cutoff_ms: Option<i64>,
    ) -> Result<OperationsReport, ServiceError> {
        let mut report = OperationsReport::default();
        let mut ops = self.registry.open_operations()?;
        // A provisioning is finished by the request that recorded it; the other kinds wait on a
        // scope's state (deletes on their drain, runs and crons on their scope), not on a request.
        let in_flight =
            |op: &OperationRecord| op.kind == PROVISION_KIND && cutoff_ms.is_some_and(|cutoff| op.updated_at >= cutoff);
        ops.retain(|op| !in_flight(op));
        // Runs and crons first: compensating them can release a delete driven in the same pass.
        ops.sort_by_key(|op| !(op.kind == RUN_KIND || op.kind == CRON_KIND));
        for op in ops {
            match self.drive(&op) {
                Ok(outcome) => report.count(outcome),
                Err(e) => {
                    tracing::error!(operation_id = %op.operation_id, kind = %op.kind, error = %e, "operation recovery failed");
                    report.failed += 1;
                }
            }
        }
        Ok(report)
    }

    fn drive(&self, op: &OperationRecord) -> Result<Outcome, ServiceError> {
        // The deployment-level cutover operation is recorded completed; nothing to drive.
        let Some(scope) = &op.scope_id else { return Ok(Outcome::Waiting) };
        let Some(rec) = self.registry.get(scope)? else {
            self.registry.compensate_operation(&op.operation_id, "scope_vanished")?;
            return Ok(Outcome::Compensated);
        };
        match op.kind.as_str() {
            PROVISION_KIND => self.drive_provision(op, &rec),
            DELETE_KIND => self.drive_delete(op, &rec),
            PURGE_KIND => self.drive_purge(op, &rec),
            RUN_KIND => self.drive_run(op, &rec),
            CRON_KIND => self.drive_cron(op, &rec),
            _ => Ok(Outcome::Waiting),
        }
    }

    /// Record-only compensation: the operation's scope went another way, nothing is left to undo.
    fn compensate_record(&self, op: &OperationRecord, code: &str) -> Result<Outcome, ServiceError> {
        self.registry.compensate_operation(&op.operation_id, code)?;
        tracing::info!(operation_id = %op.operation_id, kind = %op.kind, reason = code, "operation compensated");
        Ok(Outcome::Compensated)
    }

    fn drive_provision(&self, op: &OperationRecord, rec: &ScopeRecord) -> Result<Outcome, ServiceError> {
        if op.state == OperationState::Compensating {
            return self.compensate_provisioning(op);
        }
        match rec.state {
            ScopeState::Provisioning => {
                let deadline = op.created_at.saturating_add(ms(self.lifecycle.draft_ttl));
                if op.state == OperationState::Failed && self.registry.now_ms() >= deadline {
                    self.registry.begin_compensation(&op.operation_id, "provision_expired")?;
                    return self.compensate_provisioning(op);
                }
                self.finish_provisioning(rec)?;
                Ok(Outcome::Resumed)
            }
            ScopeState::Draft | ScopeState::Active => {
                self.registry.complete_operation(&op.operation_id)?;
                Ok(Outcome::Completed)
            }
            ScopeState::Deleting | ScopeState::Deleted => self.compensate_record(op, "scope_deleted"),
        }
    }

    /// Undoes a provisioning that cannot finish: unmounts and closes the scope, removes its local
    /// data, then the registry marks it `deleted` and the operation `compensated` together.
    fn compensate_provisioning(&self, op: &OperationRecord) -> Result<Outcome, ServiceError> {
        let _one_at_a_time = self.provisioning.lock();
        if let Some(scope) = &op.scope_id {
            if self.registry.get(scope)?.is_some_and(|r| r.state == ScopeState::Provisioning) {
                self.open.close(scope)?;
                self.open.remove_local(scope)?;
            }
        }
        failpoint("compensate_after_undo");
        self.registry.compensate_provision(&op.operation_id)?;
        tracing::warn!(operation_id = %op.operation_id, "provisioning compensated; the scope is deleted");
        Ok(Outcome::Compensated)
    }

    fn drive_delete(&self, op: &OperationRecord, rec: &ScopeRecord) -> Result<Outcome, ServiceError> {
        match (op.state, rec.state) {
            (OperationState::Compensating, _) => self.compensate_record(op, "delete_compensated"),
            (_, ScopeState::Deleting) => {
                self.freeze(&rec.scope_id);
                Ok(match self.try_finish_delete(&rec.scope_id)? {
                    DeleteStep::Deleted(_) => Outcome::Deleted,
                    DeleteStep::Blocked(_) => Outcome::StillDeleting,
                })
            }
            (_, ScopeState::Deleted) => {
                self.registry.complete_operation(&op.operation_id)?;
                Ok(Outcome::Completed)
            }
            _ => self.compensate_record(op, "scope_not_deleting"),
        }
    }

    fn drive_purge(&self, op: &OperationRecord, rec: &ScopeRecord) -> Result<Outcome, ServiceError> {
        match rec.state {
            ScopeState::Deleted if op.state != OperationState::Compensating => {
                self.purge(rec)?;
                Ok(Outcome::Resumed)
            }
            _ => self.compensate_record(op, "scope_not_deleted"),
        }
    }

    fn drive_run(&self, op: &OperationRecord, rec: &ScopeRecord) -> Result<Outcome, ServiceError> {
        let prefix = format!("run:{}:", rec.scope_id);
        let Some(run_request_id) = op.operation_id.strip_prefix(&prefix) else {
            return self.compensate_record(op, "unknown_run_operation");
        };
        if rec.state.is_mountable() && op.state != OperationState::Compensating {
            let run = self.registry.run_request(&rec.scope_id, run_request_id)?;
            if run.state == RunRequestState::Reserved {
                return Ok(Outcome::Waiting);
            }
        }
        let run = self.registry.compensate_run(&rec.scope_id, run_request_id, "scope_closed")?;
        if run.state == RunRequestState::Cancelled {
            tracing::info!(scope_id = %rec.scope_id, "run reservation compensated");
            return Ok(Outcome::Compensated);
        }
        Ok(Outcome::Completed)
    }

    fn drive_cron(&self, op: &OperationRecord, rec: &ScopeRecord) -> Result<Outcome, ServiceError> {
        if rec.state.is_mountable() && op.state != OperationState::Compensating {
            return Ok(Outcome::Waiting);
        }
        self.registry.compensate_cron(&op.operation_id, "scope_closed")?;
        Ok(Outcome::Compensated)
    }

    /// `MigrationRequired` when the gate is `required` and `thread` has no scope yet, unless the
    /// caller creates it as a new conversation (`new_thread`) and the migration report checks out.
    /// A thread that is not new and has no scope is one the cutover missed (seed 000 §11.1: "unknown
    /// old threads answer migration-required in required mode"; only the gateway's thread metadata
    /// knows which threads are old, so it says which are new).
    pub(super) fn check_cutover_gate(&self, thread: &ThreadId, new_thread: bool) -> Result<(), ServiceError> {
        if self.cutover.mode == CutoverMode::Off || self.registry.find_by_thread(thread)?.is_some() {
            return Ok(());
        }
        if !new_thread {
            tracing::warn!("provisioning refused: a thread that is not new has no scope (missed by the cutover)");
            return Err(ServiceError::MigrationRequired);
        }
        match self.verified_report() {
            Ok(()) => Ok(()),
            Err(reason) => {
                tracing::warn!(reason, "provisioning refused: migration required");
                Err(ServiceError::MigrationRequired)
            }
        }
    }

    /// At startup in `required` mode (seed 000 §11.1): the configured report must be a passed one of
    /// this deployment matching the newest recorded cutover, else the daemon does not start (`Err`
    /// says why and what to do).
    pub fn verify_cutover_at_startup(&self) -> Result<(), String> {
        if self.cutover.mode != CutoverMode::Required {
            return Ok(());
        }
        self.verified_report().map_err(|reason| {
            format!(
                "cutover.mode is \"required\" but {reason}: run the cutover with mode \"off\", record its passed \
                 report (POST /internal/workspace-cutover/report), then switch to \"required\""
            )
        })
    }

    /// Whether the report's deployment id, status and SHA-256 match the newest recorded cutover
    /// operation (`Err` names what did not).
    fn verified_report(&self) -> Result<(), &'static str> {
        let (op_id, sha) = self.read_report()?;
        let op = self.registry.latest_cutover().map_err(|_| "registry unavailable")?.ok_or("no cutover recorded")?;
        if op.operation_id != op_id || op.result_sha256.as_deref() != Some(sha.as_str()) {
            return Err("the report does not match the recorded cutover operation");
        }
        Ok(())
    }

    /// Reads the configured report: its `operation_id` and SHA-256, if it is `passed` for this deployment.
    fn read_report(&self) -> Result<(String, String), &'static str> {
        let path = self.cutover.report.as_ref().ok_or("no report configured")?;
        let file = std::fs::File::open(path).map_err(|_| "the report cannot be read")?;
        let mut bytes = Vec::new();
        file.take(MAX_REPORT_BYTES + 1).read_to_end(&mut bytes).map_err(|_| "the report cannot be read")?;
        if bytes.len() as u64 > MAX_REPORT_BYTES {
            return Err("the report is too large");
        }
        let json: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| "the report is not JSON")?;
        if json.get("deployment_id").and_then(|v| v.as_str()) != Some(self.cutover.deployment_id.as_str()) {
            return Err("the report is for another deployment");
        }
        if json.get("status").and_then(|v| v.as_str()) != Some("passed") {
            return Err("the report has not passed");
        }
        report_gates(&json)?;
        let op_id = json.get("operation_id").and_then(|v| v.as_str()).ok_or("the report has no operation_id")?;
        Ok((op_id.to_owned(), hex::encode(Sha256::digest(&bytes))))
    }

    /// Records the configured (passed) migration report as the deployment's cutover operation with
    /// its SHA-256 — the step that opens the gate.
    pub fn record_cutover_report(&self) -> Result<OperationRecord, ServiceError> {
        let (op_id, sha) = self.read_report().map_err(|reason| {
            tracing::warn!(reason, "the migration report was not recorded");
            ServiceError::MigrationRequired
        })?;
        Ok(self.registry.record_cutover(&op_id, &sha)?)
    }
}

/// The gates of a passed report (seed 000 §11.1: "passed only when the counts are equal, no legacy
/// owner is left unhandled, there is no inconsistency and the static gate passed"), checked here
/// rather than taken on the report's `status`: `counts.threads`, `counts.scopes` and
/// `counts.primary_owners` equal; `unhandled_legacy_owners` and `inconsistencies` 0;
/// `static_gate` "passed". A missing field fails.
fn report_gates(json: &serde_json::Value) -> Result<(), &'static str> {
    let count = |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_u64);
    let counts = json.get("counts");
    let [threads, scopes, owners] =
        ["threads", "scopes", "primary_owners"].map(|k| count(counts.and_then(|c| c.get(k))));
    let (Some(threads), Some(scopes), Some(owners)) = (threads, scopes, owners) else {
        return Err("the report lacks counts.threads, counts.scopes or counts.primary_owners");
    };
    if threads != scopes || scopes != owners {
        return Err("the report's thread, scope and primary owner counts differ");
    }
    if count(json.get("unhandled_legacy_owners")) != Some(0) {
        return Err("the report does not show 0 unhandled_legacy_owners");
    }
    if count(json.get("inconsistencies")) != Some(0) {
        return Err("the report does not show 0 inconsistencies");
    }
    if json.get("static_gate").and_then(|v| v.as_str()) != Some("passed") {
        return Err("the report's static_gate has not passed");
    }
    Ok(())
}

fn ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
