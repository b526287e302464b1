//! SQL of usage a gateway settled (`[billing] mode = "report"`, issue 24 item 5): the gateway is the
//! billing authority, so `/admin/mark-settled` only marks a pending record `reported` (no charge,
//! no ledger row here), once.

use crate::registry::db::params;

use super::{commit_settlement, settleable_in, Settlement};
use crate::billing::BillingError;
use crate::registry::admin_audit::AdminAction;
use crate::registry::Registry;

impl Registry {
    /// Marks usage record `usage_id` settled by the gateway: `Settled` the first time,
    /// `AlreadySettled` after (whoever settled it); `ArtifactsPending` while its artifacts wait for
    /// registration (the gateway registers them first, seed 003 §10.2).
    pub fn mark_usage_reported(&self, usage_id: i64) -> Result<Settlement, BillingError> {
        self.mark_usage_reported_audited(usage_id, None)
    }

    /// [`Registry::mark_usage_reported`] for an admin request: a mark it makes is audited in its
    /// transaction.
    pub fn mark_usage_reported_audited(
        &self,
        usage_id: i64,
        audit: Option<&AdminAction>,
    ) -> Result<Settlement, BillingError> {
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        if let Err(settled) = settleable_in(&tx, usage_id)? {
            return Ok(settled);
        }
        let n = tx.execute(
            "UPDATE compute_usage_log
             SET settlement_status = 'reported', settled_at = ?2, settlement_error = NULL, next_attempt_at = NULL,
                 last_attempt_at = ?2
             WHERE usage_id = ?1 AND EXISTS (SELECT 1 FROM usage_state_transitions
                                             WHERE from_state = compute_usage_log.settlement_status AND to_state = 'reported')",
            params![usage_id, now],
        )?;
        commit_settlement(tx, usage_id, n, audit.map(|a| (a, now)))
    }
}
