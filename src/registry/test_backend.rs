//! The registry the registry and billing suites run on: embedded SQLite in memory, or, when
//! `SCOPEFS_TEST_POSTGRES_URL` names a PostgreSQL database, a fresh schema of it (the test command
//! runs both suites both ways).

use std::sync::atomic::{AtomicU64, Ordering};

use super::{PgSettings, Registry, RegistryError};

/// The variable naming the PostgreSQL database of the suites' second run.
pub const POSTGRES_URL_ENV: &str = "SCOPEFS_TEST_POSTGRES_URL";

impl Registry {
    /// A new, empty registry on the suites' backend (see the module's text).
    pub fn open_for_tests() -> Result<Registry, RegistryError> {
        match std::env::var(POSTGRES_URL_ENV) {
            Ok(url) if !url.is_empty() => {
                Registry::open_postgres(&PgSettings { url, pool_size: 4, schema: Some(fresh_schema()) })
            }
            _ => Registry::open_in_memory(),
        }
    }
}

/// Where a suite's registry lives when several handles (threads, child processes) open it: a
/// SQLite file in `dir`, or a fresh schema (`pg:<schema>`) of the suites' PostgreSQL database.
pub fn new_place(dir: &std::path::Path) -> String {
    match std::env::var(POSTGRES_URL_ENV) {
        Ok(url) if !url.is_empty() => format!("pg:{}", fresh_schema()),
        _ => dir.join("registry.sqlite3").to_string_lossy().into_owned(),
    }
}

/// Opens the registry at a place of [`new_place`].
pub fn open_place(place: &str) -> Result<Registry, RegistryError> {
    match place.strip_prefix("pg:") {
        Some(schema) => {
            let url = std::env::var(POSTGRES_URL_ENV).unwrap_or_default();
            Registry::open_postgres(&PgSettings { url, pool_size: 4, schema: Some(schema.to_string()) })
        }
        None => Registry::open(std::path::Path::new(place)),
    }
}

/// A schema name no other test uses.
pub fn fresh_schema() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("t{}_{}_{}", std::process::id(), n, rand::random::<u32>())
}
