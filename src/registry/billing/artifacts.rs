//! SQL of the artifact manifest (seed 003 §3.8, §10.3): the `artifacts` rows of an environment
//! (path, size, SHA-256, content type), their registration by the artifact registrar, and usage
//! listings by settlement state for the admin API.

use crate::registry::db::{params, Conn};
use serde::{Deserialize, Serialize};

use super::{query_usages, UsageRecord};
use crate::billing::BillingError;
use crate::registry::admin_audit::{self, AdminAction};
use crate::registry::{Registry, RegistryError};

/// One file an environment produced: its path relative to the scope root (`/workspace`), size,
/// SHA-256 (hex) and content type (from the extension).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactEntry {
    pub path: String,
    pub size_bytes: u64,
    pub sha256: String,
    pub content_type: String,
    /// The snapshot of its store that keeps the bytes as hashed (`None`: recorded before
    /// artifacts were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
}

/// A recorded artifact and when the registrar registered it (`None`: not yet).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArtifactRow {
    #[serde(flatten)]
    pub entry: ArtifactEntry,
    pub registered_at: Option<i64>,
}

fn validate_entry(e: &ArtifactEntry) -> Result<(), RegistryError> {
    let path_ok = !e.path.is_empty() && e.path.len() <= 4096 && !e.path.chars().any(char::is_control);
    let sha_ok = e.sha256.len() == 64 && e.sha256.bytes().all(|b| b.is_ascii_hexdigit());
    let type_ok = !e.content_type.is_empty() && e.content_type.len() <= 255;
    let snapshot_ok = e.snapshot_id.as_ref().is_none_or(|s| !s.is_empty() && s.len() <= 255);
    (path_ok && sha_ok && type_ok && snapshot_ok && i64::try_from(e.size_bytes).is_ok()).then_some(()).ok_or(
        RegistryError::Invalid {
            field: "artifacts",
            reason: "an entry needs a 1-4096 character path, a hex SHA-256 and a content type",
        },
    )
}

/// Records `manifest` for `environment_id` inside the caller's transaction: new paths are added,
/// changed files (another SHA-256) replace their row and lose their registration. When anything
/// changed and the usage is not settled, its artifacts become `pending` again (registered before
/// the money, seed 003 §10.3). Returns how many rows changed.
pub(crate) fn record_manifest_in(
    conn: &Conn<'_>,
    now: i64,
    environment_id: &str,
    manifest: &[ArtifactEntry],
) -> Result<usize, RegistryError> {
    let mut changed = 0;
    for e in manifest {
        validate_entry(e)?;
        changed += conn.execute(
            "INSERT INTO artifacts (environment_id, path, created_at, size_bytes, sha256, content_type, snapshot_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (environment_id, path) DO UPDATE SET
                 size_bytes = excluded.size_bytes, sha256 = excluded.sha256,
                 content_type = excluded.content_type, snapshot_id = excluded.snapshot_id, registered_at = NULL
             WHERE artifacts.sha256 IS DISTINCT FROM excluded.sha256
                OR artifacts.size_bytes IS DISTINCT FROM excluded.size_bytes",
            params![
                environment_id,
                e.path,
                now,
                i64::try_from(e.size_bytes).unwrap_or(i64::MAX),
                e.sha256,
                e.content_type,
                e.snapshot_id
            ],
        )?;
    }
    // Changed rows reopen a registered usage; unregistered rows (recorded while another stop was
    // ending the environment) make a usage without artifacts pending.
    conn.execute(
        "UPDATE compute_usage_log SET artifacts_state = 'pending', artifact_attempts = 0
         WHERE environment_id = ?1 AND settlement_status = 'pending'
           AND (artifacts_state = 'none' OR (artifacts_state = 'registered' AND ?2 > 0))
           AND EXISTS (SELECT 1 FROM artifacts WHERE environment_id = ?1 AND registered_at IS NULL)",
        params![environment_id, i64::try_from(changed).unwrap_or(i64::MAX)],
    )?;
    Ok(changed)
}

fn manifest_in(conn: &Conn<'_>, environment_id: &str) -> Result<Vec<ArtifactRow>, RegistryError> {
    let mut stmt = conn.prepare(
        "SELECT path, size_bytes, sha256, content_type, registered_at, snapshot_id FROM artifacts
         WHERE environment_id = ?1 ORDER BY path",
    )?;
    let rows = stmt.query_map([environment_id], |r| {
        let size: Option<i64> = r.get(1)?;
        Ok(ArtifactRow {
            entry: ArtifactEntry {
                path: r.get(0)?,
                size_bytes: size.and_then(|s| u64::try_from(s).ok()).unwrap_or(0),
                sha256: r.get::<_, Option<String>>(2)?.unwrap_or_default(),
                content_type: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
                snapshot_id: r.get(5)?,
            },
            registered_at: r.get(4)?,
        })
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

impl Registry {
    /// Records the manifest of an environment that has already ended (destroy after the timer
    /// ended it); see `record_manifest_in`. Returns how many rows changed.
    pub fn record_artifacts(&self, environment_id: &str, manifest: &[ArtifactEntry]) -> Result<usize, BillingError> {
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let changed = record_manifest_in(&tx, now, environment_id, manifest)?;
        tx.commit()?;
        Ok(changed)
    }

    /// The manifest recorded for an environment, by path.
    pub fn artifact_manifest(&self, environment_id: &str) -> Result<Vec<ArtifactRow>, BillingError> {
        Ok(manifest_in(&self.db.conn()?, environment_id)?)
    }

    /// The registration of the registry's own registrar: stamps every unregistered artifact of the
    /// environment with now. Returns how many rows it stamped.
    pub fn stamp_artifacts_registered(&self, environment_id: &str) -> Result<usize, BillingError> {
        let now = self.now_ms();
        let conn = self.db.conn()?;
        Ok(conn.execute(
            "UPDATE artifacts SET registered_at = ?2 WHERE environment_id = ?1 AND registered_at IS NULL",
            params![environment_id, now],
        )?)
    }

    /// Marks the artifacts of these usages registered (idempotent; settled usages are left alone)
    /// and stamps their manifest rows registered (whoever registered them, they are registered).
    /// Returns how many records changed.
    pub fn mark_artifacts_registered(&self, usage_ids: &[i64]) -> Result<usize, BillingError> {
        self.mark_artifacts_registered_audited(usage_ids, None)
    }

    /// [`Registry::mark_artifacts_registered`] for an admin request: when it changes any record, the
    /// request is audited (with how many changed) in its transaction.
    pub fn mark_artifacts_registered_audited(
        &self,
        usage_ids: &[i64],
        audit: Option<&AdminAction>,
    ) -> Result<usize, BillingError> {
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let mut changed = 0;
        for id in usage_ids {
            changed += tx.execute(
                "UPDATE compute_usage_log SET artifacts_state = 'registered', artifact_error = NULL
                 WHERE usage_id = ?1 AND artifacts_state IN ('pending', 'unregistered')",
                [id],
            )?;
            tx.execute(
                "UPDATE artifacts SET registered_at = ?2 WHERE registered_at IS NULL
                   AND environment_id = (SELECT environment_id FROM compute_usage_log WHERE usage_id = ?1)",
                params![id, now],
            )?;
        }
        if let Some(action) = audit.filter(|_| changed > 0) {
            let mut action = action.clone();
            action.detail["updated"] = serde_json::json!(changed);
            admin_audit::record_in(&tx, &action, now)?;
        }
        tx.commit()?;
        Ok(changed)
    }

    /// Usage records by settlement state (the admin API's `settled` 0/1), oldest first.
    pub fn usage_by_state(&self, settled: bool, limit: usize) -> Result<Vec<UsageRecord>, BillingError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let filter = if settled { "settlement_status <> 'pending'" } else { "settlement_status = 'pending'" };
        let q = format!("{filter} ORDER BY usage_id LIMIT ?1");
        Ok(query_usages(&self.db.conn()?, &q, &[&limit])?)
    }
}
