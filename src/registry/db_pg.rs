//! The registry on PostgreSQL: a pool of `tokio-postgres` connections (`deadpool-postgres`) driven
//! by a small runtime of the registry's own, the placeholder rewrite, typed values both ways, the
//! advisory lock that serializes write transactions, and the migrations of
//! `migrations/registry-postgres/` (version in `scopefs_schema_version`; newer databases refused).
//!
//! The registry's callers are synchronous (they run on the daemon's bounded blocking pools, as with
//! SQLite): each call blocks its thread on the async client while the connections' I/O runs on the
//! registry's runtime. Write transactions take one transaction-scoped advisory lock
//! (`pg_advisory_xact_lock`) before their first statement, so they run one after another across
//! every connection and every node, exactly as SQLite's `BEGIN IMMEDIATE` does on one host: every
//! compare-and-set and every money transaction is reasoned once, for both backends. Reads outside a
//! transaction take no lock; each statement sees one committed state.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime as PoolRuntime};
use tokio_postgres::types::{IsNull, Type};
use tokio_postgres::NoTls;

use super::db::{DbError, Result, Row, Value};
use crate::migrate::{MigrateError, Migration};

/// How long a statement may run, a lock be waited for, and a transaction sit idle (a frozen or
/// partitioned node's transaction is ended by the server, so its lock does not stall the others).
const STATEMENT_TIMEOUT_MS: u64 = 30_000;
const LOCK_TIMEOUT_MS: u64 = 10_000;
const IDLE_IN_TRANSACTION_MS: u64 = 5_000;
/// How long a caller waits for a pooled connection, or for a new one.
const POOL_WAIT: Duration = Duration::from_secs(10);

/// How to reach the registry's PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PgSettings {
    /// `postgres://user:password@host:port/database` (key-value strings work too).
    pub url: String,
    /// Connections in the pool.
    pub pool_size: usize,
    /// A schema to use instead of `public` (created when missing): tests give each registry its own.
    pub schema: Option<String>,
}

/// The pool and the runtime that drives it.
pub(super) struct PgBackend {
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    pool: Pool,
    /// The advisory lock of this registry's write transactions.
    lock_key: i64,
}

impl PgBackend {
    /// Connects (one connection checked now) and applies the migrations.
    pub(super) fn open(
        settings: &PgSettings,
        migrations: &[Migration],
    ) -> std::result::Result<(PgBackend, i64), OpenError> {
        let mut config: tokio_postgres::Config = settings.url.parse().map_err(|e| OpenError::Url(format!("{e}")))?;
        let mut options = config.get_options().unwrap_or_default().to_string();
        options.push_str(&format!(
            " -c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={LOCK_TIMEOUT_MS} \
             -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}"
        ));
        if let Some(schema) = &settings.schema {
            if !crate::ids::is_token(schema) || schema.contains(['.', ':', '-']) {
                return Err(OpenError::Url("schema must be letters, digits and '_'".into()));
            }
            options.push_str(&format!(" -c search_path={schema}"));
        }
        config.options(options.trim());
        config.keepalives(true).keepalives_idle(Duration::from_secs(30));
        config.connect_timeout(POOL_WAIT);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("registry-pg")
            .enable_all()
            .build()
            .map_err(|e| OpenError::Url(format!("starting the registry's runtime: {e}")))?;
        let handle = runtime.handle().clone();
        let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = {
            let _in = handle.enter();
            Pool::builder(manager)
                .max_size(settings.pool_size.max(1))
                .runtime(PoolRuntime::Tokio1)
                .wait_timeout(Some(POOL_WAIT))
                .create_timeout(Some(POOL_WAIT))
                .recycle_timeout(Some(POOL_WAIT))
                .build()
                .map_err(|e| OpenError::Url(format!("{e}")))?
        };
        let lock_key = lock_key(settings.schema.as_deref().unwrap_or("public"));
        let backend = PgBackend { runtime: Some(runtime), handle, pool, lock_key };
        if let Some(schema) = &settings.schema {
            // The search path names it; it must exist before the first statement that uses it.
            // Under the registry's lock: nodes starting together would race to create it.
            let c = backend.conn().map_err(OpenError::Db)?;
            let created = c.begin().and_then(|()| c.batch(&format!("CREATE SCHEMA IF NOT EXISTS {schema}; COMMIT")));
            if let Err(e) = created {
                let _ = c.batch("ROLLBACK");
                return Err(OpenError::Db(e));
            }
        }
        let version = backend.migrate(migrations)?;
        Ok((backend, version))
    }

    fn run<F: Future>(&self, f: F) -> F::Output {
        let _in = self.handle.enter();
        futures_executor::block_on(f)
    }

    pub(super) fn conn(&self) -> Result<PgConn<'_>> {
        let client = self.run(self.pool.get()).map_err(|e| DbError::Postgres(format!("registry connection: {e}")))?;
        Ok(PgConn { client, backend: self })
    }

    /// Brings the schema to the newest migration, each in its own locked transaction.
    fn migrate(&self, migrations: &[Migration]) -> std::result::Result<i64, OpenError> {
        let supported = migrations.last().map(|m| m.version).unwrap_or(0);
        let c = self.conn().map_err(OpenError::Db)?;
        let version = |c: &PgConn<'_>| -> Result<i64> {
            let rows = c.query("SELECT version FROM scopefs_schema_version", &[])?;
            rows.first().map_or(Ok(0), |r| r.get(0))
        };
        c.begin().map_err(OpenError::Db)?;
        let created = c
            .batch("CREATE TABLE IF NOT EXISTS scopefs_schema_version (version BIGINT NOT NULL)")
            .and_then(|_| version(&c))
            .and_then(|v| {
                if v == 0 {
                    c.batch("DELETE FROM scopefs_schema_version; INSERT INTO scopefs_schema_version VALUES (0)")
                } else {
                    Ok(())
                }
            })
            .and_then(|_| c.batch("COMMIT"));
        if let Err(e) = created {
            let _ = c.batch("ROLLBACK");
            return Err(OpenError::Db(e));
        }
        for m in migrations {
            c.begin().map_err(OpenError::Db)?;
            let step = version(&c).and_then(|found| {
                if found > supported {
                    return Ok(Some(found));
                }
                if m.version > found {
                    c.batch(m.sql)?;
                    c.execute("UPDATE scopefs_schema_version SET version = ?1", &[Value::Integer(m.version)], false)?;
                }
                Ok(None)
            });
            match step {
                Ok(None) => c.batch("COMMIT").map_err(OpenError::Db)?,
                Ok(Some(found)) => {
                    let _ = c.batch("ROLLBACK");
                    return Err(OpenError::Migrate(MigrateError::NewerDatabase { found, supported }));
                }
                Err(e) => {
                    let _ = c.batch("ROLLBACK");
                    return Err(OpenError::Migrate(MigrateError::Failed { version: m.version, source: Box::new(e) }));
                }
            }
        }
        Ok(supported)
    }
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        // Never blocks: the registry may be dropped on an async task.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Why the PostgreSQL registry could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("registry url: {0}")]
    Url(String),
    #[error("{0}")]
    Db(DbError),
    #[error("{0}")]
    Migrate(MigrateError),
}

/// One pooled connection.
pub(super) struct PgConn<'a> {
    client: Object,
    backend: &'a PgBackend,
}

impl PgConn<'_> {
    /// Begins a write transaction holding the registry's lock.
    pub(super) fn begin(&self) -> Result<()> {
        self.batch(&format!("BEGIN; SELECT pg_advisory_xact_lock({})", self.backend.lock_key))
    }

    pub(super) fn batch(&self, sql: &str) -> Result<()> {
        self.backend.run(self.client.batch_execute(sql)).map_err(pg_error)
    }

    pub(super) fn execute(&self, sql: &str, values: &[Value], autocommit: bool) -> Result<usize> {
        if !autocommit {
            return self.execute_in_tx(sql, values);
        }
        self.begin()?;
        let n = self.execute_in_tx(sql, values);
        match n.and_then(|n| self.batch("COMMIT").map(|_| n)) {
            Ok(n) => Ok(n),
            Err(e) => {
                let _ = self.batch("ROLLBACK");
                Err(e)
            }
        }
    }

    fn execute_in_tx(&self, sql: &str, values: &[Value]) -> Result<usize> {
        let sql = translate(sql);
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = values.iter().map(|v| v as _).collect();
        self.backend
            .run(async {
                let stmt = self.client.prepare_cached(&sql).await?;
                self.client.execute(&stmt, &params).await
            })
            .map_err(pg_error)
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    }

    pub(super) fn query(&self, sql: &str, values: &[Value]) -> Result<Vec<Row<'static>>> {
        let sql = translate(sql);
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = values.iter().map(|v| v as _).collect();
        let (stmt, rows) = self
            .backend
            .run(async {
                let stmt = self.client.prepare_cached(&sql).await?;
                let rows = self.client.query(&stmt, &params).await?;
                Ok::<_, tokio_postgres::Error>((stmt, rows))
            })
            .map_err(pg_error)?;
        let names: Arc<[String]> = stmt.columns().iter().map(|c| c.name().to_string()).collect();
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let mut values = Vec::with_capacity(names.len());
            for (i, col) in r.columns().iter().enumerate() {
                values.push(
                    read_value(r, i, col.type_())
                        .map_err(|reason| DbError::Column { column: col.name().to_string(), reason })?,
                );
            }
            out.push(Row::new(names.clone(), values));
        }
        Ok(out)
    }
}

fn read_value(r: &tokio_postgres::Row, i: usize, ty: &Type) -> std::result::Result<Value, &'static str> {
    let bad = |_| "could not be decoded";
    let int = |v: Option<i64>| v.map_or(Value::Null, Value::Integer);
    Ok(match *ty {
        Type::INT8 => int(r.try_get::<_, Option<i64>>(i).map_err(bad)?),
        Type::INT4 => int(r.try_get::<_, Option<i32>>(i).map_err(bad)?.map(i64::from)),
        Type::INT2 => int(r.try_get::<_, Option<i16>>(i).map_err(bad)?.map(i64::from)),
        Type::BOOL => int(r.try_get::<_, Option<bool>>(i).map_err(bad)?.map(i64::from)),
        Type::TEXT | Type::VARCHAR | Type::NAME | Type::BPCHAR | Type::UNKNOWN => {
            r.try_get::<_, Option<String>>(i).map_err(bad)?.map_or(Value::Null, Value::Text)
        }
        Type::BYTEA => r.try_get::<_, Option<Vec<u8>>>(i).map_err(bad)?.map_or(Value::Null, Value::Blob),
        Type::VOID => Value::Null,
        _ => return Err("has a type the registry does not read (cast it to BIGINT or TEXT)"),
    })
}

impl tokio_postgres::types::ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Integer(v) => match *ty {
                Type::INT8 => v.to_sql(ty, out),
                Type::INT4 => i32::try_from(*v)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*v)?.to_sql(ty, out),
                Type::BOOL => (*v != 0).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR | Type::UNKNOWN => v.to_string().to_sql(ty, out),
                _ => Err(format!("an integer bound to a {ty} parameter").into()),
            },
            Value::Text(s) => s.as_str().to_sql(ty, out),
            Value::Blob(b) => b.as_slice().to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

fn pg_error(e: tokio_postgres::Error) -> DbError {
    match e.as_db_error() {
        Some(db) if db.code().code().starts_with("23") => {
            DbError::Constraint(format!("{}: {}", db.code().code(), db.message()))
        }
        Some(db) => DbError::Postgres(format!("{}: {}", db.code().code(), db.message())),
        None => DbError::Postgres(e.to_string()),
    }
}

/// The registry's SQL in PostgreSQL's spelling: `?N` placeholders become `$N` (string literals and
/// quoted names are left alone).
pub(super) fn translate(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut quote: Option<char> = None;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) => {
                out.push('$');
                continue;
            }
            None => {}
        }
        out.push(c);
    }
    out
}

/// The advisory lock key of a schema's registry (FNV-1a of its name).
fn lock_key(schema: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in "scopefs-registry:".bytes().chain(schema.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

#[cfg(test)]
mod tests {
    use super::translate;

    #[test]
    fn placeholders_become_dollars_outside_literals() {
        assert_eq!(translate("SELECT ?1, '?2', \"a?3\" WHERE x = ?12"), "SELECT $1, '?2', \"a?3\" WHERE x = $12");
        assert_eq!(translate("a ? b"), "a ? b");
    }
}
