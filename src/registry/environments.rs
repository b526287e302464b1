//! SQL of `environments` and `environment_processes`: sandbox environments of a scope, their
//! background processes, and the owners that stand for them in `scope_owners`.
//!
//! An environment is registered (with an `environment` owner, `reserved`) before its container
//! exists, gets its container id attached, becomes `running` (owner `active`) and finally `ended`
//! or `failed` (owner `terminal`/`failed`) exactly once — whoever ends it first (destroy, the
//! max-runtime timer, the container's death, startup reconciliation, a scope delete) records the
//! end reason and the honest runtime; later attempts change nothing. States move only along
//! `environment_state_transitions` / `process_state_transitions`, with a revision compare-and-set.
//! Every lookup a caller can reach is scoped: another scope's environment or process is not found.

use std::fmt;
use std::str::FromStr;

use crate::registry::db::{params, Conn, OptionalExtension, Row};

use super::billing::ArtifactEntry;
use super::leases::refuse_if_blocked_in;
use super::owners::{get_owner_in, insert_owner_in, require_open_scope_in, set_owner_state_in};
use super::{to_i64, to_u64, DeploymentRegistry, OwnerState, OwnerType, RegistryError};
use crate::ids::ScopeId;

string_enum!(
    /// `creating → running → ended`, `creating → failed | ended`.
    EnvironmentState, "environment state", {
    Creating => "creating",
    Running => "running",
    Ended => "ended",
    Failed => "failed",
});

impl EnvironmentState {
    /// Still holds (or may hold) a container.
    pub fn is_live(self) -> bool {
        matches!(self, EnvironmentState::Creating | EnvironmentState::Running)
    }
}

string_enum!(
    /// `starting → running → exited | stopped | lost`, `starting → failed | lost`.
    ProcessState, "process state", {
    Starting => "starting",
    Running => "running",
    Exited => "exited",
    Stopped => "stopped",
    Failed => "failed",
    Lost => "lost",
});

impl ProcessState {
    pub fn is_live(self) -> bool {
        matches!(self, ProcessState::Starting | ProcessState::Running)
    }
}

/// One row of `environments`. Times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct EnvironmentRecord {
    pub environment_id: String,
    pub scope_id: ScopeId,
    pub owner_id: String,
    pub user_id: String,
    pub thread_id: String,
    /// Internal (never returned by the API).
    #[serde(skip)]
    pub container_id: Option<String>,
    pub read_only: bool,
    pub state: EnvironmentState,
    pub revision: u64,
    pub requested_max_runtime_seconds: Option<u64>,
    pub effective_max_runtime_seconds: u64,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub runtime_seconds: Option<u64>,
    pub end_reason: Option<String>,
}

/// A request to register an environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEnvironment {
    pub user_id: String,
    pub thread_id: String,
    pub read_only: bool,
    pub requested_max_runtime_seconds: Option<u64>,
    pub effective_max_runtime_seconds: u64,
    /// Live environments the scope may hold at once (this one included).
    pub max_live_per_scope: u64,
    /// The price it was admitted at (`PricingConfig::snapshot_json`), carried to its usage;
    /// `None` without billing.
    pub pricing_snapshot: Option<String>,
}

/// One row of `environment_processes`. Times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct ProcessRecord {
    pub process_id: String,
    pub scope_id: ScopeId,
    pub environment_id: String,
    pub owner_id: String,
    pub command: String,
    #[serde(skip)]
    pub exec_id: Option<String>,
    pub state: ProcessState,
    pub revision: u64,
    pub exit_code: Option<i64>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub end_reason: Option<String>,
}

const ENV_COLUMNS: &str = "environment_id, scope_id, owner_id, user_id, thread_id, container_id, read_only, state, \
     revision, requested_max_runtime_seconds, effective_max_runtime_seconds, created_at, started_at, ended_at, \
     runtime_seconds, end_reason";

const PROC_COLUMNS: &str = "process_id, scope_id, environment_id, owner_id, command, exec_id, state, revision, \
     exit_code, created_at, started_at, ended_at, end_reason";

fn corrupt(what: &str) -> RegistryError {
    RegistryError::Corrupt(format!("invalid {what}"))
}

fn env_from_row(r: &Row<'_>) -> crate::registry::db::Result<Result<EnvironmentRecord, RegistryError>> {
    let scope: String = r.get(1)?;
    let state: String = r.get(7)?;
    let requested: Option<i64> = r.get(9)?;
    let runtime: Option<i64> = r.get(14)?;
    let revision: i64 = r.get(8)?;
    let effective: i64 = r.get(10)?;
    Ok((|| {
        Ok(EnvironmentRecord {
            environment_id: r.get(0)?,
            scope_id: ScopeId::parse(&scope).map_err(|_| corrupt("scope_id in environments"))?,
            owner_id: r.get(2)?,
            user_id: r.get(3)?,
            thread_id: r.get(4)?,
            container_id: r.get(5)?,
            read_only: r.get::<_, i64>(6)? != 0,
            state: state.parse()?,
            revision: to_u64(revision, "environment revision")?,
            requested_max_runtime_seconds: requested.map(|v| to_u64(v, "requested runtime")).transpose()?,
            effective_max_runtime_seconds: to_u64(effective, "effective runtime")?,
            created_at: r.get(11)?,
            started_at: r.get(12)?,
            ended_at: r.get(13)?,
            runtime_seconds: runtime.map(|v| to_u64(v, "runtime_seconds")).transpose()?,
            end_reason: r.get(15)?,
        })
    })())
}

fn proc_from_row(r: &Row<'_>) -> crate::registry::db::Result<Result<ProcessRecord, RegistryError>> {
    let scope: String = r.get(1)?;
    let state: String = r.get(6)?;
    let revision: i64 = r.get(7)?;
    Ok((|| {
        Ok(ProcessRecord {
            process_id: r.get(0)?,
            scope_id: ScopeId::parse(&scope).map_err(|_| corrupt("scope_id in environment_processes"))?,
            environment_id: r.get(2)?,
            owner_id: r.get(3)?,
            command: r.get(4)?,
            exec_id: r.get(5)?,
            state: state.parse()?,
            revision: to_u64(revision, "process revision")?,
            exit_code: r.get(8)?,
            created_at: r.get(9)?,
            started_at: r.get(10)?,
            ended_at: r.get(11)?,
            end_reason: r.get(12)?,
        })
    })())
}

fn query_envs(
    conn: &Conn<'_>,
    filter: &str,
    args: &[&dyn crate::registry::db::ToSql],
) -> Result<Vec<EnvironmentRecord>, RegistryError> {
    let sql = format!("SELECT {ENV_COLUMNS} FROM environments WHERE {filter} ORDER BY created_at, environment_id");
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map(args, env_from_row)?;
    let mut out = Vec::new();
    for row in rows {
        out.push(row??);
    }
    Ok(out)
}

fn query_procs(
    conn: &Conn<'_>,
    filter: &str,
    args: &[&dyn crate::registry::db::ToSql],
) -> Result<Vec<ProcessRecord>, RegistryError> {
    let sql =
        format!("SELECT {PROC_COLUMNS} FROM environment_processes WHERE {filter} ORDER BY created_at, process_id");
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map(args, proc_from_row)?;
    let mut out = Vec::new();
    for row in rows {
        out.push(row??);
    }
    Ok(out)
}

fn get_env_in(conn: &Conn<'_>, deployment: &str, env: &str) -> Result<Option<EnvironmentRecord>, RegistryError> {
    let sql = format!("SELECT {ENV_COLUMNS} FROM environments WHERE deployment_id = ?1 AND environment_id = ?2");
    conn.query_row(&sql, params![deployment, env], env_from_row).optional()?.transpose()
}

fn get_proc_in(conn: &Conn<'_>, deployment: &str, pid: &str) -> Result<Option<ProcessRecord>, RegistryError> {
    let sql = format!("SELECT {PROC_COLUMNS} FROM environment_processes WHERE deployment_id = ?1 AND process_id = ?2");
    conn.query_row(&sql, params![deployment, pid], proc_from_row).optional()?.transpose()
}

/// Moves an owner to a settled state unless it already is settled (settled owners stay as they are).
fn settle_owner_in(
    conn: &Conn<'_>,
    deployment: &str,
    owner_id: &str,
    to: OwnerState,
    now: i64,
) -> Result<(), RegistryError> {
    let Some(owner) = get_owner_in(conn, deployment, owner_id)? else { return Ok(()) };
    if owner.state.is_settled() {
        return Ok(());
    }
    set_owner_state_in(conn, deployment, &owner, None, to, now)?;
    Ok(())
}

/// CAS state change of an environment along `environment_state_transitions`; `false` if refused.
fn set_env_state_in(
    conn: &Conn<'_>,
    deployment: &str,
    rec: &EnvironmentRecord,
    to: EnvironmentState,
    extra: &str,
    extra_args: &[&dyn crate::registry::db::ToSql],
) -> Result<bool, RegistryError> {
    let sql = format!(
        "UPDATE environments SET state = ?1, revision = revision + 1 {extra}
         WHERE deployment_id = ?2 AND environment_id = ?3 AND revision = ?4
           AND EXISTS (SELECT 1 FROM environment_state_transitions WHERE from_state = environments.state AND to_state = ?1)"
    );
    let revision = to_i64(rec.revision);
    let to_str = to.as_str();
    let mut args: Vec<&dyn crate::registry::db::ToSql> = vec![&to_str, &deployment, &rec.environment_id, &revision];
    args.extend_from_slice(extra_args);
    Ok(conn.execute(&sql, args.as_slice())? == 1)
}

/// Runtime in whole seconds, rounded up, between two millisecond timestamps.
pub fn runtime_seconds(started_at: Option<i64>, ended_at: i64) -> u64 {
    match started_at {
        Some(start) if ended_at > start => u64::try_from(ended_at - start).unwrap_or(0).div_ceil(1000),
        _ => 0,
    }
}

/// Billing hook (SPEC §9): called inside the transaction that ends an environment, exactly once per
/// environment, with its final record (`runtime_seconds` set). The billing work records the
/// environment's pending usage here; until then the environment row itself is the record.
fn record_pending_usage_in(
    conn: &Conn<'_>,
    ended: &EnvironmentRecord,
    outputs: &[ArtifactEntry],
) -> Result<(), RegistryError> {
    // An environment that never started (failed creation) ran nothing and is not billed.
    if ended.started_at.is_none() {
        return Ok(());
    }
    let now = ended.ended_at.unwrap_or(ended.created_at);
    let runtime = ended.runtime_seconds.unwrap_or(0);
    super::billing::record_usage_in(conn, now, &ended.user_id, &ended.thread_id, &ended.environment_id, runtime, &[])?;
    // The manifest goes in the same transaction: the usage is never seen without its artifacts.
    super::billing::record_manifest_in(conn, now, &ended.environment_id, outputs)?;
    Ok(())
}

impl DeploymentRegistry {
    /// Records the seed fields an environment was created with (canonical JSON; see migration 7).
    pub fn set_environment_options(&self, environment_id: &str, options_json: &str) -> Result<(), RegistryError> {
        let deployment = self.id.as_str();
        self.db.conn()?.execute(
            "UPDATE environments SET create_options = ?1 WHERE deployment_id = ?2 AND environment_id = ?3",
            params![options_json, deployment, environment_id],
        )?;
        Ok(())
    }

    /// The create options recorded for an environment (`None`: none were recorded).
    pub fn environment_options(&self, environment_id: &str) -> Result<Option<String>, RegistryError> {
        let deployment = self.id.as_str();
        let conn = self.db.conn()?;
        let found: Option<Option<String>> = conn
            .query_row(
                "SELECT create_options FROM environments WHERE deployment_id = ?1 AND environment_id = ?2",
                params![deployment, environment_id],
                |r| r.get(0),
            )
            .optional()?;
        Ok(found.flatten())
    }

    /// Registers an environment (`creating`) and its `environment` owner (`reserved`) in a draft or
    /// active scope. `Ok(None)` when the scope already has `max_live_per_scope` live environments.
    pub fn create_environment(
        &self,
        scope: &ScopeId,
        new: &NewEnvironment,
    ) -> Result<Option<EnvironmentRecord>, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        refuse_if_blocked_in(&tx, deployment, now)?;
        require_open_scope_in(&tx, deployment, scope)?;
        let live: i64 = tx.query_row(
            "SELECT COUNT(*) FROM environments WHERE deployment_id = ?1 AND scope_id = ?2 AND state IN ('creating', 'running')",
            params![deployment, scope.as_str()],
            |r| r.get(0),
        )?;
        if to_u64(live, "live environments")? >= new.max_live_per_scope {
            return Ok(None);
        }
        let environment_id = format!("env_{}", uuid::Uuid::now_v7().simple());
        let owner = insert_owner_in(
            &tx,
            deployment,
            scope,
            OwnerType::Environment,
            Some(&environment_id),
            None,
            OwnerState::Reserved,
            now,
        )?;
        tx.execute(
            "INSERT INTO environments (deployment_id, environment_id, scope_id, owner_id, user_id, thread_id, read_only, state,
                                       requested_max_runtime_seconds, effective_max_runtime_seconds, created_at,
                                       pricing_snapshot)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'creating', ?8, ?9, ?10, ?11)",
            params![
                deployment,
                environment_id,
                scope.as_str(),
                owner.owner_id,
                new.user_id,
                new.thread_id,
                i64::from(new.read_only),
                new.requested_max_runtime_seconds.map(to_i64),
                to_i64(new.effective_max_runtime_seconds),
                now,
                new.pricing_snapshot
            ],
        )?;
        let rec = get_env_in(&tx, deployment, &environment_id)?.ok_or_else(|| corrupt("new environment"))?;
        tx.commit()?;
        Ok(Some(rec))
    }

    /// Records the container of a `creating` environment (before it is started, so a crash leaves a trace).
    pub fn attach_container(
        &self,
        environment_id: &str,
        container_id: &str,
    ) -> Result<EnvironmentRecord, RegistryError> {
        let deployment = self.id.as_str();
        let conn = self.db.conn()?;
        conn.execute(
            "UPDATE environments SET container_id = ?1, revision = revision + 1
             WHERE deployment_id = ?2 AND environment_id = ?3 AND state = 'creating' AND container_id IS NULL",
            params![container_id, deployment, environment_id],
        )?;
        get_env_in(&conn, deployment, environment_id)?.ok_or(RegistryError::OwnerNotFound)
    }

    /// `creating → running` (owner `active`), `started_at` = now. `Ok(None)` if it ended meanwhile.
    pub fn environment_started(&self, environment_id: &str) -> Result<Option<EnvironmentRecord>, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let rec = get_env_in(&tx, deployment, environment_id)?.ok_or(RegistryError::OwnerNotFound)?;
        if !set_env_state_in(&tx, deployment, &rec, EnvironmentState::Running, ", started_at = ?5", &[&now])? {
            return Ok(None);
        }
        if let Some(owner) = get_owner_in(&tx, deployment, &rec.owner_id)? {
            if owner.state == OwnerState::Reserved {
                set_owner_state_in(&tx, deployment, &owner, None, OwnerState::Active, now)?;
            }
        }
        let rec = get_env_in(&tx, deployment, environment_id)?.ok_or_else(|| corrupt("environment"))?;
        tx.commit()?;
        Ok(Some(rec))
    }

    /// Ends a live environment once: `ended` (or `failed` when `failed`), `ended_at` = now, honest
    /// `runtime_seconds`, the reason, its owner settled, its live processes `lost`, and the billing
    /// hook called in the same transaction. Returns the record and whether this call ended it
    /// (`false`: it had already ended — nothing changes).
    pub fn end_environment(
        &self,
        environment_id: &str,
        failed: bool,
        reason: &str,
    ) -> Result<(EnvironmentRecord, bool), RegistryError> {
        self.end_environment_with_outputs(environment_id, failed, reason, &[])
    }

    /// `end_environment`, recording `outputs` (the artifact manifest) with the pending usage in the
    /// same transaction (seed 003 §3.8, §10.3).
    pub fn end_environment_with_outputs(
        &self,
        environment_id: &str,
        failed: bool,
        reason: &str,
        outputs: &[ArtifactEntry],
    ) -> Result<(EnvironmentRecord, bool), RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let rec = get_env_in(&tx, deployment, environment_id)?.ok_or(RegistryError::OwnerNotFound)?;
        if !rec.state.is_live() {
            return Ok((rec, false));
        }
        let to = if failed && rec.state == EnvironmentState::Creating {
            EnvironmentState::Failed
        } else {
            EnvironmentState::Ended
        };
        // An environment is allowed to run exactly its effective max runtime; the seconds it takes
        // to stop it after that are the daemon's, not the account's (the preflight promised that much).
        let runtime = to_i64(runtime_seconds(rec.started_at, now).min(rec.effective_max_runtime_seconds));
        if !set_env_state_in(
            &tx,
            deployment,
            &rec,
            to,
            ", ended_at = ?5, runtime_seconds = ?6, end_reason = ?7",
            &[&now, &runtime, &reason],
        )? {
            return Err(corrupt("environment transition"));
        }
        let owner_to = if to == EnvironmentState::Failed { OwnerState::Failed } else { OwnerState::Terminal };
        settle_owner_in(&tx, deployment, &rec.owner_id, owner_to, now)?;
        for p in query_procs(
            &tx,
            "deployment_id = ?1 AND environment_id = ?2 AND state IN ('starting', 'running')",
            &[&deployment, &environment_id],
        )? {
            end_process_in(&tx, deployment, &p, ProcessState::Lost, None, "environment_ended", now)?;
        }
        let ended = get_env_in(&tx, deployment, environment_id)?.ok_or_else(|| corrupt("environment"))?;
        record_pending_usage_in(&tx, &ended, outputs)?;
        tx.commit()?;
        Ok((ended, true))
    }

    /// One environment of `scope`; another scope's environment is `None`.
    pub fn environment(
        &self,
        scope: &ScopeId,
        environment_id: &str,
    ) -> Result<Option<EnvironmentRecord>, RegistryError> {
        let deployment = self.id.as_str();
        Ok(get_env_in(&self.db.conn()?, deployment, environment_id)?.filter(|e| &e.scope_id == scope))
    }

    /// One environment of any scope (startup reconciliation, and telling another scope's id from a
    /// missing one; never returned to a request).
    pub fn environment_unscoped(&self, environment_id: &str) -> Result<Option<EnvironmentRecord>, RegistryError> {
        let deployment = self.id.as_str();
        get_env_in(&self.db.conn()?, deployment, environment_id)
    }

    /// Every environment of `scope`, oldest first.
    pub fn environments(&self, scope: &ScopeId) -> Result<Vec<EnvironmentRecord>, RegistryError> {
        let deployment = self.id.as_str();
        query_envs(&self.db.conn()?, "deployment_id = ?1 AND scope_id = ?2", &[&deployment, &scope.as_str()])
    }

    /// Every live (`creating`/`running`) environment of the deployment (reconciliation and shutdown).
    pub fn live_environments(&self) -> Result<Vec<EnvironmentRecord>, RegistryError> {
        let deployment = self.id.as_str();
        query_envs(&self.db.conn()?, "deployment_id = ?1 AND state IN ('creating', 'running')", &[&deployment])
    }

    /// Registers a background process (`starting`) with a `background_process` owner whose parent is
    /// the environment's owner. `Ok(None)` unless the environment is `running` in `scope`.
    pub fn create_process(
        &self,
        scope: &ScopeId,
        environment_id: &str,
        command: &str,
    ) -> Result<Option<ProcessRecord>, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        refuse_if_blocked_in(&tx, deployment, now)?;
        require_open_scope_in(&tx, deployment, scope)?;
        let Some(env) = get_env_in(&tx, deployment, environment_id)?.filter(|e| &e.scope_id == scope) else {
            return Ok(None);
        };
        if env.state != EnvironmentState::Running {
            return Ok(None);
        }
        let process_id = format!("proc_{}", uuid::Uuid::now_v7().simple());
        let owner = insert_owner_in(
            &tx,
            deployment,
            scope,
            OwnerType::BackgroundProcess,
            Some(&process_id),
            Some(&env.owner_id),
            OwnerState::Reserved,
            now,
        )?;
        tx.execute(
            "INSERT INTO environment_processes (deployment_id, process_id, scope_id, environment_id, owner_id, command, state, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'starting', ?7)",
            params![deployment, process_id, scope.as_str(), environment_id, owner.owner_id, command, now],
        )?;
        let rec = get_proc_in(&tx, deployment, &process_id)?.ok_or_else(|| corrupt("new process"))?;
        tx.commit()?;
        Ok(Some(rec))
    }

    /// `starting → running` with its exec id (owner `active`). `Ok(None)` if it ended meanwhile.
    pub fn process_started(&self, process_id: &str, exec_id: &str) -> Result<Option<ProcessRecord>, RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let rec = get_proc_in(&tx, deployment, process_id)?.ok_or(RegistryError::OwnerNotFound)?;
        let changed = tx.execute(
            "UPDATE environment_processes SET state = 'running', revision = revision + 1, exec_id = ?1, started_at = ?2
             WHERE deployment_id = ?3 AND process_id = ?4 AND revision = ?5
               AND EXISTS (SELECT 1 FROM process_state_transitions WHERE from_state = environment_processes.state AND to_state = 'running')",
            params![exec_id, now, deployment, process_id, to_i64(rec.revision)],
        )?;
        if changed != 1 {
            return Ok(None);
        }
        if let Some(owner) = get_owner_in(&tx, deployment, &rec.owner_id)? {
            if owner.state == OwnerState::Reserved {
                set_owner_state_in(&tx, deployment, &owner, None, OwnerState::Active, now)?;
            }
        }
        let rec = get_proc_in(&tx, deployment, process_id)?;
        tx.commit()?;
        Ok(rec)
    }

    /// Ends a live process once (`exited`/`stopped`/`failed`/`lost`), settling its owner. Returns the
    /// record and whether this call ended it.
    pub fn end_process(
        &self,
        process_id: &str,
        to: ProcessState,
        exit_code: Option<i64>,
        reason: &str,
    ) -> Result<(ProcessRecord, bool), RegistryError> {
        let deployment = self.id.as_str();
        let now = self.now_ms();
        let mut conn = self.db.conn()?;
        let tx = conn.transaction()?;
        let rec = get_proc_in(&tx, deployment, process_id)?.ok_or(RegistryError::OwnerNotFound)?;
        if !rec.state.is_live() {
            return Ok((rec, false));
        }
        let changed = end_process_in(&tx, deployment, &rec, to, exit_code, reason, now)?;
        let rec = get_proc_in(&tx, deployment, process_id)?.ok_or_else(|| corrupt("process"))?;
        tx.commit()?;
        Ok((rec, changed))
    }

    /// One process of `scope`; another scope's process is `None`.
    pub fn process(&self, scope: &ScopeId, process_id: &str) -> Result<Option<ProcessRecord>, RegistryError> {
        let deployment = self.id.as_str();
        Ok(get_proc_in(&self.db.conn()?, deployment, process_id)?.filter(|p| &p.scope_id == scope))
    }

    /// One process of any scope (to tell another scope's id from a missing one; never returned to a
    /// request).
    pub fn process_unscoped(&self, process_id: &str) -> Result<Option<ProcessRecord>, RegistryError> {
        let deployment = self.id.as_str();
        get_proc_in(&self.db.conn()?, deployment, process_id)
    }

    /// The processes of `scope` (optionally of one environment), oldest first.
    pub fn processes(
        &self,
        scope: &ScopeId,
        environment_id: Option<&str>,
    ) -> Result<Vec<ProcessRecord>, RegistryError> {
        let deployment = self.id.as_str();
        query_procs(
            &self.db.conn()?,
            "deployment_id = ?1 AND scope_id = ?2 AND (CAST(?3 AS TEXT) IS NULL OR environment_id = ?3)",
            &[&deployment, &scope.as_str(), &environment_id],
        )
    }
}

/// Ends one live process inside the caller's transaction; `false` if its state already moved on.
fn end_process_in(
    conn: &Conn<'_>,
    deployment: &str,
    rec: &ProcessRecord,
    to: ProcessState,
    exit_code: Option<i64>,
    reason: &str,
    now: i64,
) -> Result<bool, RegistryError> {
    let changed = conn.execute(
        "UPDATE environment_processes
         SET state = ?1, revision = revision + 1, exit_code = ?2, ended_at = ?3, end_reason = ?4
         WHERE deployment_id = ?5 AND process_id = ?6 AND revision = ?7
           AND EXISTS (SELECT 1 FROM process_state_transitions WHERE from_state = environment_processes.state AND to_state = ?1)",
        params![to.as_str(), exit_code, now, reason, deployment, rec.process_id, to_i64(rec.revision)],
    )?;
    if changed != 1 {
        return Ok(false);
    }
    let owner_to = if to == ProcessState::Failed { OwnerState::Failed } else { OwnerState::Terminal };
    settle_owner_in(conn, deployment, &rec.owner_id, owner_to, now)?;
    Ok(true)
}

#[cfg(test)]
mod tests;
