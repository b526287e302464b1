//! The registry (control database): scopes, owners, run reservations, leases and lifecycle operations,
//! in embedded SQLite or in PostgreSQL (`db.rs` is the one way to either).
//!
//! Write transactions run one at a time (SQLite's `BEGIN IMMEDIATE`, PostgreSQL's advisory lock:
//! `db_pg.rs`). Every state change is checked against the transition tables of
//! the schema (`scope_state_transitions`, `operation_state_transitions`,
//! `owner_state_transitions`, `run_request_state_transitions`), so the state
//! machines are data, not code. All SQL of the registry lives in this module.
//! Time comes from an injectable [`Clock`].

/// An enum stored as text: `as_str`, `Display`, a strict `FromStr` (an unknown value is
/// `Corrupt`), serde in snake_case and `ALL`.
macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident, $what:literal, { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = RegistryError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| RegistryError::Corrupt(format!(concat!("unknown ", $what, " {:?}"), s)))
            }
        }
    };
}

pub mod admin_audit;
pub mod billing;
pub mod db;
mod db_pg;
pub mod environments;
pub mod forks;
pub mod imports;
mod leases;
mod lifecycle;
pub mod nodes;
pub mod nonces;
mod operations;
mod owners;
mod runs;
mod sagas;
mod scopes;
#[cfg(any(test, feature = "test-hooks"))]
pub mod test_backend;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_admin;
#[cfg(test)]
mod tests_forks;
#[cfg(test)]
mod tests_lifecycle;
#[cfg(test)]
mod tests_nodes;

use std::fmt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags};

use db::{Backend, DbError};
pub use db_pg::{OpenError as PgOpenError, PgSettings};

use crate::clock::{Clock, SystemClock};
use crate::engine::Quota;
use crate::ids::{ScopeId, ThreadId};
use crate::migrate::{self, MigrateError};

pub use leases::{Lease, BLOCKING_LEASES};
pub use lifecycle::{DeleteStep, DELETE_KIND, PURGE_KIND};
pub use operations::{OperationRecord, OperationState, Provisioned};
pub use owners::{NewOwner, OwnerRecord, OwnerState, OwnerType, OwnerUpdate};
pub use runs::{run_operation_id, Reservation, RunRequestRecord, RunRequestState, RunReserve, RunUpdate};
pub use sagas::{CRON_KIND, CUTOVER_KIND, PROVISION_KIND, RUN_KIND};

/// How long a statement waits for a lock held by another connection.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Every failure of the registry. Messages never contain physical paths.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("no such scope")]
    NotFound,
    #[error(
        "scope changed concurrently or transition refused: expected revision {expected_revision}, \
         current revision {current_revision}, current state {current_state}, requested {requested}"
    )]
    Conflict { expected_revision: u64, current_revision: u64, current_state: ScopeState, requested: ScopeState },
    #[error("thread is already bound to scope {0}")]
    ThreadAlreadyBound(ScopeId),
    #[error("idempotency key was already used for a different request")]
    OperationConflict,
    #[error("scope is {0}")]
    ScopeUnavailable(ScopeState),
    #[error("lease {0} is held: the deployment is in cutover or maintenance")]
    CutoverInProgress(String),
    #[error("no such owner in this scope")]
    OwnerNotFound,
    #[error(
        "owner changed concurrently or transition refused: current revision {current_revision}, \
         current state {current_state}, requested {requested}"
    )]
    OwnerConflict { stale_revision: bool, current_revision: u64, current_state: OwnerState, requested: OwnerState },
    #[error("resource is already owned by another owner")]
    ResourceOwned,
    #[error("a different resource_id is already attached")]
    ResourceIdAlreadySet,
    #[error("several owners of different types hold this resource; give owner_type")]
    AmbiguousResource,
    #[error("no such run request in this scope")]
    RunRequestNotFound,
    #[error("run request transition refused: current state {current}, requested {requested}")]
    RunRequestConflict { current: RunRequestState, requested: RunRequestState },
    #[error("a different run_id is already attached")]
    RunIdAlreadySet,
    #[error("interrupt already resolved by another run request")]
    InterruptAlreadyResolved,
    #[error("lease is held by another operation")]
    LeaseHeld,
    #[error("lease is not held by this operation or has expired")]
    LeaseNotHeld,
    #[error("no such node")]
    NodeNotFound,
    #[error("node transition refused: current state {current}, requested {requested}")]
    NodeTransition { current: nodes::NodeState, requested: nodes::NodeState },
    #[error("the node still serves {0} scopes: drain it first")]
    NodeHasScopes(u64),
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: &'static str },
    #[error("registry contains an invalid value: {0}")]
    Corrupt(String),
    #[error("preparing the registry file failed: {0}")]
    Io(#[source] std::io::Error),
    #[error("registry database: {0}")]
    Db(#[from] DbError),
    #[error("registry database: {0}")]
    Postgres(#[from] PgOpenError),
    #[error("{0} is not available with a PostgreSQL registry")]
    SqliteOnly(&'static str),
    #[error("registry migration: {0}")]
    Migrate(#[from] MigrateError),
}

impl RegistryError {
    /// For a `Conflict`: whether the revision was stale (else the transition itself is not allowed).
    pub fn is_stale_revision(&self) -> bool {
        matches!(self, RegistryError::Conflict { expected_revision, current_revision, .. } if expected_revision != current_revision)
    }
}

string_enum!(
    /// Lifecycle state of a scope: `provisioning → draft → active → deleting → deleted`.
    ScopeState, "scope state", {
    Provisioning => "provisioning",
    Draft => "draft",
    Active => "active",
    Deleting => "deleting",
    Deleted => "deleted",
});

impl ScopeState {
    /// Whether a scope in this state has a filesystem that should be mounted.
    pub fn is_mountable(self) -> bool {
        matches!(self, ScopeState::Draft | ScopeState::Active)
    }
}

/// One row of `scopes`. Times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeRecord {
    pub deployment_id: String,
    pub scope_id: ScopeId,
    pub primary_thread_id: ThreadId,
    pub state: ScopeState,
    pub revision: u64,
    /// `None`: the deployment's default quota applies.
    pub quota: Option<Quota>,
    pub created_at: i64,
    pub updated_at: i64,
    pub deleted_at: Option<i64>,
    /// While `deleting` cannot finish: the owners that are not settled yet.
    pub delete_blocked_by: Vec<String>,
    /// When a deleted scope's objects and local data were purged.
    pub purged_at: Option<i64>,
    /// The user the scope belongs to (seed 003 §3.7), once provisioning or a tool request named one.
    pub user_id: Option<String>,
}

impl ScopeRecord {
    /// The scope's quota, or `default` when none is recorded.
    pub fn quota_or(&self, default: Quota) -> Quota {
        self.quota.unwrap_or(default)
    }
}

/// The control database of one daemon.
pub struct Registry {
    db: Backend,
    schema_version: i64,
    clock: Arc<dyn Clock>,
}

/// The registry as one deployment sees it: every scope, owner, run, lease, operation, import,
/// nonce, environment and process method of this handle acts in deployment `id` only. Methods that
/// are not per deployment (billing, clock, schema) are the [`Registry`]'s, reached through `Deref`.
#[derive(Clone)]
pub struct DeploymentRegistry {
    registry: Arc<Registry>,
    id: String,
}

impl DeploymentRegistry {
    /// The deployment this handle acts in.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The whole registry (for another deployment's handle, or to share it).
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }
}

impl std::ops::Deref for DeploymentRegistry {
    type Target = Registry;

    fn deref(&self) -> &Registry {
        &self.registry
    }
}

impl Registry {
    /// The handle of deployment `id` (see [`DeploymentRegistry`]).
    pub fn deployment(self: &Arc<Self>, id: &str) -> DeploymentRegistry {
        DeploymentRegistry { registry: self.clone(), id: id.to_string() }
    }

    /// Opens (creating if needed) the registry at `path`: missing parent directories 0700, file 0600,
    /// WAL, `foreign_keys`, `busy_timeout`, `synchronous=FULL`, migrations applied; refuses a newer schema.
    pub fn open(path: &Path) -> Result<Registry, RegistryError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(parent).map_err(RegistryError::Io)?;
        }
        // Create the file ourselves so it is never readable by others, even for a moment.
        std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path).map_err(RegistryError::Io)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(RegistryError::Io)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(DbError::from)?;
        Self::from_connection(conn)
    }

    /// An in-memory registry (tests and dry runs).
    pub fn open_in_memory() -> Result<Registry, RegistryError> {
        Self::from_connection(Connection::open_in_memory().map_err(DbError::from)?)
    }

    fn from_connection(mut conn: Connection) -> Result<Registry, RegistryError> {
        let sqlite = |e: rusqlite::Error| RegistryError::Db(e.into());
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sqlite)?;
        let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)).map_err(sqlite)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(sqlite)?;
        conn.pragma_update(None, "foreign_keys", true).map_err(sqlite)?;
        let schema_version = migrate::apply(&mut conn, migrate::REGISTRY)?;
        Ok(Registry { db: Backend::Sqlite(Mutex::new(conn)), schema_version, clock: Arc::new(SystemClock) })
    }

    /// Opens the registry in a PostgreSQL database (shared by every node of a deployment):
    /// a pool of `settings.pool_size` connections, migrations of `migrations/registry-postgres/`
    /// applied (one node at a time); refuses a newer schema.
    pub fn open_postgres(settings: &PgSettings) -> Result<Registry, RegistryError> {
        let (pg, schema_version) = db_pg::PgBackend::open(settings, migrate::REGISTRY_POSTGRES)?;
        Ok(Registry { db: Backend::Postgres(pg), schema_version, clock: Arc::new(SystemClock) })
    }

    /// `"sqlite"` or `"postgres"`.
    pub fn backend_name(&self) -> &'static str {
        match self.db {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Whether this registry is the embedded SQLite one (only it is shipped to the object store).
    pub fn is_embedded(&self) -> bool {
        matches!(self.db, Backend::Sqlite(_))
    }

    /// Uses `clock` for every timestamp and every comparison with the current time.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Registry {
        self.clock = clock;
        self
    }

    /// The current time of the registry's clock (Unix milliseconds).
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Rows changed through this handle since it opened (a cheap "anything new?" for shipping).
    pub fn changes(&self) -> u64 {
        let Ok(conn) = self.db.conn() else { return 0 };
        // SAFETY: reads a counter of this open connection; no pointer is kept.
        conn.sqlite().map_or(0, |c| unsafe { rusqlite::ffi::sqlite3_total_changes64(c.handle()) as u64 })
    }

    /// Writes a consistent copy of the registry to `to` (SQLite's online backup), replacing any
    /// file there and its WAL.
    pub fn snapshot_to(&self, to: &Path) -> Result<(), RegistryError> {
        // A WAL left beside an earlier copy would be read into this one once it is restored.
        crate::db_files::remove_with(to, &["", "-wal", "-shm"]).map_err(RegistryError::Io)?;
        let conn = self.db.conn()?;
        let c = conn.sqlite().ok_or(RegistryError::SqliteOnly("a copy of the registry"))?;
        c.backup(rusqlite::MAIN_DB, to, None::<fn(rusqlite::backup::Progress)>).map_err(DbError::from)?;
        Ok(())
    }

    /// The schema version the database is at (after migrations).
    pub fn schema_version(&self) -> i64 {
        self.schema_version
    }
}

/// Validates an identifier from a request: 1-128 characters of `[A-Za-z0-9_.:-]`.
pub fn validate_key(field: &'static str, value: &str) -> Result<(), RegistryError> {
    crate::ids::is_token(value)
        .then_some(())
        .ok_or(RegistryError::Invalid { field, reason: "must be 1-128 characters of [A-Za-z0-9_.:-]" })
}

/// Validates an external resource id: 1-256 printable ASCII characters, no `/`.
pub fn validate_resource_id(value: &str) -> Result<(), RegistryError> {
    let ok = (1..=256).contains(&value.len()) && value.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
    ok.then_some(()).ok_or(RegistryError::Invalid {
        field: "resource_id",
        reason: "must be 1-256 printable ASCII characters without '/'",
    })
}

/// Whether `sql_err` is a UNIQUE/constraint violation.
fn is_constraint(e: &DbError) -> bool {
    e.is_constraint()
}

/// Converts a stored non-negative integer.
fn to_u64(v: i64, what: &str) -> Result<u64, RegistryError> {
    u64::try_from(v).map_err(|_| RegistryError::Corrupt(format!("negative {what}")))
}

/// Converts a count to the stored integer type.
fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
