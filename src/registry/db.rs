//! The registry's one way to the database: connections, transactions, typed parameters and rows
//! over either backend (embedded SQLite, or PostgreSQL in `db_pg.rs`), so the registry's SQL is
//! written once.
//!
//! The SQL dialect is the common ground of both: placeholders `?1`, `?2`, ... (rewritten to `$1`
//! for PostgreSQL), `ON CONFLICT`, `RETURNING`, `IS DISTINCT FROM`, `CASE`, sums cast to `BIGINT`.
//! Every write transaction is serialized with every other one, as SQLite's `BEGIN IMMEDIATE`
//! does: on PostgreSQL by a transaction-scoped advisory lock (see `db_pg.rs`), so the registry's
//! compare-and-set and money rules read the same on both.

use std::cell::Cell;
use std::ops::Deref;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use super::db_pg::{PgBackend, PgConn};

pub type Result<T> = std::result::Result<T, DbError>;

/// A failure of the registry's database, whichever backend.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("{0}")]
    Postgres(String),
    #[error("query returned no rows")]
    NoRows,
    #[error("column {column}: {reason}")]
    Column { column: String, reason: &'static str },
    /// A constraint (unique, foreign key, check) refused the statement.
    #[error("constraint violated: {0}")]
    Constraint(String),
}

impl DbError {
    /// Whether a UNIQUE/foreign key/CHECK constraint refused the statement.
    pub fn is_constraint(&self) -> bool {
        match self {
            DbError::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => f.code == rusqlite::ErrorCode::ConstraintViolation,
            DbError::Constraint(_) => true,
            _ => false,
        }
    }
}

/// A value bound to a statement or read from a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Integer(i64),
    Text(String),
    Blob(Vec<u8>),
}

/// A Rust value that can be bound to a placeholder.
pub trait ToSql {
    fn to_value(&self) -> Value;
}

macro_rules! to_sql_int {
    ($($t:ty),*) => {$(
        impl ToSql for $t {
            fn to_value(&self) -> Value {
                Value::Integer(i64::from(*self))
            }
        }
    )*};
}
to_sql_int!(i64, i32, u32, i16, u16, u8, bool);

impl ToSql for u64 {
    fn to_value(&self) -> Value {
        Value::Integer(i64::try_from(*self).unwrap_or(i64::MAX))
    }
}
impl ToSql for usize {
    fn to_value(&self) -> Value {
        Value::Integer(i64::try_from(*self).unwrap_or(i64::MAX))
    }
}
impl ToSql for str {
    fn to_value(&self) -> Value {
        Value::Text(self.to_string())
    }
}
impl ToSql for String {
    fn to_value(&self) -> Value {
        Value::Text(self.clone())
    }
}
impl ToSql for [u8] {
    fn to_value(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}
impl ToSql for Vec<u8> {
    fn to_value(&self) -> Value {
        Value::Blob(self.clone())
    }
}
impl<T: ToSql + ?Sized> ToSql for &T {
    fn to_value(&self) -> Value {
        (**self).to_value()
    }
}
impl<T: ToSql> ToSql for Option<T> {
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToSql::to_value)
    }
}

/// `params![a, b]`: the parameters of one statement, `?1` first.
macro_rules! params {
    ($($p:expr),* $(,)?) => {
        &[$(&$p as &dyn $crate::registry::db::ToSql),*] as &[&dyn $crate::registry::db::ToSql]
    };
}
pub(crate) use params;

/// The parameters of one statement: `params![...]`, a slice of them, `[a, b]` of one type, or `[]`.
pub trait Params {
    fn values(self) -> Vec<Value>;
}
impl Params for &[&dyn ToSql] {
    fn values(self) -> Vec<Value> {
        self.iter().map(|p| p.to_value()).collect()
    }
}
impl Params for [&dyn ToSql; 0] {
    fn values(self) -> Vec<Value> {
        Vec::new()
    }
}
macro_rules! params_array {
    ($($n:literal),*) => {$(
        impl<T: ToSql> Params for [T; $n] {
            fn values(self) -> Vec<Value> {
                self.iter().map(ToSql::to_value).collect()
            }
        }
    )*};
}
params_array!(1, 2, 3, 4, 5, 6, 7, 8);

/// A Rust value that can be read from a column.
pub trait FromSql: Sized {
    fn from_value(v: &Value) -> std::result::Result<Self, &'static str>;
}

impl FromSql for i64 {
    fn from_value(v: &Value) -> std::result::Result<Self, &'static str> {
        match v {
            Value::Integer(i) => Ok(*i),
            Value::Null => Err("is NULL"),
            _ => Err("is not an integer"),
        }
    }
}
macro_rules! from_sql_int {
    ($($t:ty),*) => {$(
        impl FromSql for $t {
            fn from_value(v: &Value) -> std::result::Result<Self, &'static str> {
                <$t>::try_from(i64::from_value(v)?).map_err(|_| "integer out of range")
            }
        }
    )*};
}
from_sql_int!(i32, u32, u64, u16, usize);

impl FromSql for bool {
    fn from_value(v: &Value) -> std::result::Result<Self, &'static str> {
        Ok(i64::from_value(v)? != 0)
    }
}
impl FromSql for String {
    fn from_value(v: &Value) -> std::result::Result<Self, &'static str> {
        match v {
            Value::Text(s) => Ok(s.clone()),
            Value::Null => Err("is NULL"),
            _ => Err("is not text"),
        }
    }
}
impl FromSql for Vec<u8> {
    fn from_value(v: &Value) -> std::result::Result<Self, &'static str> {
        match v {
            Value::Blob(b) => Ok(b.clone()),
            Value::Null => Err("is NULL"),
            _ => Err("is not a blob"),
        }
    }
}
impl<T: FromSql> FromSql for Option<T> {
    fn from_value(v: &Value) -> std::result::Result<Self, &'static str> {
        match v {
            Value::Null => Ok(None),
            v => T::from_value(v).map(Some),
        }
    }
}

/// A column named or numbered (from 0).
pub trait RowIndex {
    fn index(&self, names: &[String]) -> Option<usize>;
    fn describe(&self) -> String;
}
impl RowIndex for usize {
    fn index(&self, names: &[String]) -> Option<usize> {
        (*self < names.len()).then_some(*self)
    }
    fn describe(&self) -> String {
        format!("#{self}")
    }
}
impl RowIndex for &str {
    fn index(&self, names: &[String]) -> Option<usize> {
        names.iter().position(|n| n.eq_ignore_ascii_case(self))
    }
    fn describe(&self) -> String {
        self.to_string()
    }
}

/// One row of a result.
pub struct Row<'a> {
    names: Arc<[String]>,
    values: Vec<Value>,
    _of: std::marker::PhantomData<&'a ()>,
}

impl Row<'_> {
    pub(super) fn new(names: Arc<[String]>, values: Vec<Value>) -> Row<'static> {
        Row { names, values, _of: std::marker::PhantomData }
    }

    /// The value of column `idx`, converted.
    pub fn get<I: RowIndex, T: FromSql>(&self, idx: I) -> Result<T> {
        let column = || idx.describe();
        let i = idx.index(&self.names).ok_or_else(|| DbError::Column { column: column(), reason: "no such column" })?;
        T::from_value(&self.values[i]).map_err(|reason| DbError::Column { column: column(), reason })
    }
}

/// `.optional()`: no row is `None`.
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>>;
}
impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(DbError::NoRows) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Where the registry lives.
pub(super) enum Backend {
    Sqlite(Mutex<rusqlite::Connection>),
    Postgres(PgBackend),
}

impl Backend {
    /// A connection for a few statements or one transaction (SQLite: the one connection, held).
    pub(super) fn conn(&self) -> Result<Conn<'_>> {
        let inner = match self {
            Backend::Sqlite(c) => Inner::Sqlite(c.lock()),
            Backend::Postgres(pg) => Inner::Pg(Box::new(pg.conn()?)),
        };
        Ok(Conn { inner, in_tx: Cell::new(false) })
    }
}

enum Inner<'a> {
    Sqlite(MutexGuard<'a, rusqlite::Connection>),
    Pg(Box<PgConn<'a>>),
}

/// A connection checked out of the backend.
pub struct Conn<'a> {
    inner: Inner<'a>,
    in_tx: Cell<bool>,
}

impl<'a> Conn<'a> {
    /// Runs one statement; the number of rows it changed. Outside a transaction a write is its own
    /// serialized transaction.
    pub fn execute(&self, sql: &str, params: impl Params) -> Result<usize> {
        let values = params.values();
        match &self.inner {
            Inner::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                Ok(stmt.execute(rusqlite::params_from_iter(values.into_iter().map(to_rusqlite)))?)
            }
            Inner::Pg(c) => c.execute(sql, &values, !self.in_tx.get()),
        }
    }

    /// Runs a query; every row it returns.
    pub fn query_rows(&self, sql: &str, params: impl Params) -> Result<Vec<Row<'static>>> {
        let values = params.values();
        match &self.inner {
            Inner::Sqlite(c) => sqlite_rows(c, sql, values),
            Inner::Pg(c) => c.query(sql, &values),
        }
    }

    /// Runs a query and maps its first row (`DbError::NoRows` when there is none).
    pub fn query_row<T, F>(&self, sql: &str, params: impl Params, f: F) -> Result<T>
    where
        F: FnOnce(&Row<'_>) -> Result<T>,
    {
        let rows = self.query_rows(sql, params)?;
        rows.first().map_or(Err(DbError::NoRows), f)
    }

    /// A statement to run with `query_map`.
    pub fn prepare(&self, sql: &str) -> Result<Stmt<'_, 'a>> {
        Ok(Stmt { conn: self, sql: sql.to_string() })
    }

    /// Begins a write transaction, serialized with every other one (SQLite `BEGIN IMMEDIATE`;
    /// PostgreSQL: the registry's advisory lock). Dropped without `commit`, it rolls back.
    pub fn transaction(&mut self) -> Result<Tx<'_, 'a>> {
        match &mut self.inner {
            Inner::Sqlite(c) => c.execute_batch("BEGIN IMMEDIATE")?,
            Inner::Pg(c) => c.begin()?,
        }
        self.in_tx.set(true);
        Ok(Tx { conn: self, finished: false })
    }

    fn end(&self, commit: bool) -> Result<()> {
        self.in_tx.set(false);
        let sql = if commit { "COMMIT" } else { "ROLLBACK" };
        match &self.inner {
            Inner::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Inner::Pg(c) => c.batch(sql),
        }
    }

    /// The SQLite connection, for what only SQLite has (backup, change counters); `None` on PostgreSQL.
    pub(super) fn sqlite(&self) -> Option<&rusqlite::Connection> {
        match &self.inner {
            Inner::Sqlite(c) => Some(c),
            Inner::Pg(_) => None,
        }
    }
}

/// A prepared query (`query_map`).
pub struct Stmt<'c, 'a> {
    conn: &'c Conn<'a>,
    sql: String,
}

impl Stmt<'_, '_> {
    /// Runs the query and maps every row.
    pub fn query_map<T, F>(&mut self, params: impl Params, mut f: F) -> Result<std::vec::IntoIter<Result<T>>>
    where
        F: FnMut(&Row<'_>) -> Result<T>,
    {
        let rows = self.conn.query_rows(&self.sql, params)?;
        Ok(rows.iter().map(&mut f).collect::<Vec<_>>().into_iter())
    }
}

/// An open write transaction; derefs to its connection.
pub struct Tx<'c, 'a> {
    conn: &'c mut Conn<'a>,
    finished: bool,
}

impl Tx<'_, '_> {
    pub fn commit(mut self) -> Result<()> {
        self.finished = true;
        self.conn.end(true)
    }
}

impl<'a> Deref for Tx<'_, 'a> {
    type Target = Conn<'a>;
    fn deref(&self) -> &Conn<'a> {
        self.conn
    }
}

impl Drop for Tx<'_, '_> {
    fn drop(&mut self) {
        if !self.finished {
            if let Err(e) = self.conn.end(false) {
                tracing::warn!(error = %e, "registry: rolling back a transaction failed");
            }
        }
    }
}

fn to_rusqlite(v: Value) -> rusqlite::types::Value {
    match v {
        Value::Null => rusqlite::types::Value::Null,
        Value::Integer(i) => rusqlite::types::Value::Integer(i),
        Value::Text(s) => rusqlite::types::Value::Text(s),
        Value::Blob(b) => rusqlite::types::Value::Blob(b),
    }
}

fn sqlite_rows(c: &rusqlite::Connection, sql: &str, values: Vec<Value>) -> Result<Vec<Row<'static>>> {
    let mut stmt = c.prepare_cached(sql)?;
    let names: Arc<[String]> = stmt.column_names().map(String::from).collect();
    let width = names.len();
    let mut rows = stmt.query(rusqlite::params_from_iter(values.into_iter().map(to_rusqlite)))?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let mut values = Vec::with_capacity(width);
        for i in 0..width {
            values.push(match r.get_ref(i)? {
                rusqlite::types::ValueRef::Null => Value::Null,
                rusqlite::types::ValueRef::Integer(i) => Value::Integer(i),
                rusqlite::types::ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                rusqlite::types::ValueRef::Blob(b) => Value::Blob(b.to_vec()),
                rusqlite::types::ValueRef::Real(_) => {
                    return Err(DbError::Column { column: names[i].clone(), reason: "is a real number" })
                }
            });
        }
        out.push(Row::new(names.clone(), values));
    }
    Ok(out)
}
