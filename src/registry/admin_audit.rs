//! SQL of the admin audit log (seed 003 §2 `exec_admin_audit_log`): one row per state-changing
//! admin request (a credit, a plan or quota change, a settlement mark, an artifact mark), written
//! inside the transaction of the change it records, so no change is without its row and no row
//! without its change. Rows are never updated or deleted by the daemon.

use serde::Serialize;

use crate::registry::db::{params, Conn, Row};
use crate::registry::{Registry, RegistryError};

/// What an admin request did, as recorded: `action` is one of the fixed names below, `subject` the
/// account, usage record or environment it acted on, `detail` its parameters and outcome (JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminAction {
    pub action: &'static str,
    pub subject: String,
    pub detail: serde_json::Value,
}

/// `POST /admin/accounts/{user_id}/credit`.
pub const CREDIT: &str = "credit";
/// `PUT /admin/accounts/{user_id}/plan`.
pub const SET_PLAN: &str = "set_plan";
/// `PUT /admin/accounts/{user_id}/quota-adjustment`.
pub const SET_QUOTA_ADJUSTMENT: &str = "set_quota_adjustment";
/// `POST /admin/mark-settled` (settled here, or marked settled by the gateway in report mode).
pub const MARK_SETTLED: &str = "mark_settled";
/// `POST /admin/mark-artifacts-registered`.
pub const MARK_ARTIFACTS_REGISTERED: &str = "mark_artifacts_registered";

/// One row of `admin_audit_log`. Times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct AuditEntry {
    pub audit_id: i64,
    pub action: String,
    pub subject: String,
    pub detail: serde_json::Value,
    pub created_at: i64,
}

/// Most bytes of one row's subject and detail (they come from admin bodies, already bounded).
const MAX_TEXT: usize = 4096;

fn bounded(text: String) -> String {
    if text.len() <= MAX_TEXT {
        return text;
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Records `action` inside the caller's transaction.
pub(crate) fn record_in(conn: &Conn<'_>, action: &AdminAction, now: i64) -> Result<(), RegistryError> {
    conn.execute(
        "INSERT INTO admin_audit_log (action, subject, detail, created_at) VALUES (?1, ?2, ?3, ?4)",
        params![action.action, bounded(action.subject.clone()), bounded(action.detail.to_string()), now],
    )?;
    Ok(())
}

fn audit_row(r: &Row<'_>) -> crate::registry::db::Result<AuditEntry> {
    let detail: String = r.get(3)?;
    Ok(AuditEntry {
        audit_id: r.get(0)?,
        action: r.get(1)?,
        subject: r.get(2)?,
        // A detail cut at the bound is kept as the string it is.
        detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::String(detail)),
        created_at: r.get(4)?,
    })
}

impl Registry {
    /// Audit rows, newest first, at most `limit`, older than `before` if given.
    pub fn admin_audit(&self, limit: usize, before: Option<i64>) -> Result<Vec<AuditEntry>, RegistryError> {
        let conn = self.db.conn()?;
        let mut stmt = conn.prepare(
            "SELECT audit_id, action, subject, detail, created_at FROM admin_audit_log
             WHERE CAST(?1 AS BIGINT) IS NULL OR audit_id < ?1 ORDER BY audit_id DESC LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![before, i64::try_from(limit).unwrap_or(i64::MAX)], audit_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}
