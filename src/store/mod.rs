//! The object-store abstraction: the `ObjectStore` trait, its error type, block keys and the startup probe.

pub mod local;
pub mod memory;
pub(crate) mod pack;
pub mod s3;

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

pub use local::LocalDirStore;
pub use memory::MemoryStore;
pub use s3::{S3Settings, S3Store};

/// Errors of the object-store layer. Messages never carry credentials.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("object not found: {key}")]
    NotFound { key: String },
    #[error("object store unavailable: {0}")]
    Unavailable(String),
    #[error("object store did not answer within {0:?}")]
    Timeout(Duration),
    #[error("object store refused the request: {0}")]
    Rejected(String),
    #[error("object store configuration is invalid: {0}")]
    Config(String),
    #[error("local object I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

impl StoreError {
    /// Whether retrying the same request may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Timeout(_) | StoreError::Io(_))
    }
}

/// One listed object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
}

/// Byte storage for immutable objects addressed by key.
///
/// Keys are relative (`scopes/<scope>/blocks/<sha256>`); an implementation may
/// add its own configured prefix. `delete` of a missing key succeeds.
#[async_trait]
pub trait ObjectStore: Send + Sync + 'static {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StoreError>;
    /// Stores a group of objects; one result per item, in order. The default runs up to
    /// `concurrency` puts at once; a store that can share durability work across a group (the
    /// local directory: one flush per group, not two per object) overrides it.
    async fn put_many(&self, items: Vec<(String, Bytes)>, concurrency: usize) -> Vec<Result<(), StoreError>> {
        use futures_util::stream::{self, StreamExt};
        stream::iter(items)
            .map(|(key, data)| async move { self.put(&key, data).await })
            .buffered(concurrency.max(1))
            .collect()
            .await
    }
    /// `put` of bytes whose SHA-256 the caller knows (`sha256_hex`, lowercase): a store that signs
    /// its requests signs this hash instead of hashing the bytes again (the server still checks the
    /// bytes against it). The caller guarantees it is their hash.
    async fn put_hashed(&self, key: &str, data: Bytes, sha256_hex: &str) -> Result<(), StoreError> {
        let _ = sha256_hex;
        self.put(key, data).await
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError>;
    /// Size of the object, or `None` when it does not exist.
    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError>;
    async fn delete(&self, key: &str) -> Result<(), StoreError>;
    /// Every object whose key starts with `prefix`, keys relative as given to `put`.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError>;
    /// A short description for logs and `doctor`, never containing secrets.
    fn describe(&self) -> String;
    /// Whether a `get` costs about what a read of the local block cache costs (a local
    /// directory): uploaded blocks are then not copied into the cache as well.
    fn reads_are_local(&self) -> bool {
        false
    }
    /// `get` answered on the calling thread, for a store that reads a local disk (`Some`); a store
    /// that would wait on the network answers `None` and is asked through `get`. A FUSE read of
    /// a local directory's block then costs no hand-over to another thread and back.
    fn get_now(&self, _key: &str) -> Option<Result<Bytes, StoreError>> {
        None
    }
    /// Fills `buf` from `offset` of an object, on the calling thread, for a store that reads a
    /// local disk (`Some`; an object shorter than the range is an error); `None` otherwise.
    fn read_at_now(&self, _key: &str, _offset: u64, _buf: &mut [u8]) -> Option<Result<(), StoreError>> {
        None
    }
}

/// Key of a content-addressed block of one scope.
pub fn block_key(scope_id: &str, sha256_hex: &str) -> String {
    format!("scopes/{scope_id}/blocks/{sha256_hex}")
}

/// Key of a block of one scope stored under fencing epoch `epoch` (with several nodes, each owner
/// of a scope stores its blocks under keys of its own epoch: a deposed owner's late deletes never
/// reach them); epoch 0 (one node) is [`block_key`].
pub fn block_key_at(scope_id: &str, epoch: u64, sha256_hex: &str) -> String {
    match epoch {
        0 => block_key(scope_id, sha256_hex),
        e => format!("scopes/{scope_id}/blocks/{sha256_hex}.e{e}"),
    }
}

/// The block and the fencing epoch a key of [`block_key_at`] under `scope_id` names; `None` for
/// any other key.
pub fn block_of_key<'a>(scope_id: &str, key: &'a str) -> Option<(&'a str, u64)> {
    let name = key.strip_prefix("scopes/")?.strip_prefix(scope_id)?.strip_prefix("/blocks/")?;
    match name.split_once(".e") {
        None => Some((name, 0)),
        Some((sha, epoch)) => Some((sha, epoch.parse().ok().filter(|e| *e > 0)?)),
    }
}

/// Prefix under which every object of one scope lives.
pub fn scope_prefix(scope_id: &str) -> String {
    format!("scopes/{scope_id}/")
}

/// Startup probe (seed 003 §12): put, get back, compare, delete a probe object.
pub async fn probe(store: &dyn ObjectStore) -> Result<(), StoreError> {
    let key = format!("probe/{}", uuid::Uuid::now_v7());
    let body = Bytes::from(format!("scopefs probe {key}"));
    store.put(&key, body.clone()).await?;
    let got = store.get(&key).await;
    let deleted = store.delete(&key).await;
    let got = got?;
    deleted?;
    if got != body {
        return Err(StoreError::Rejected("probe object came back with different bytes".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_keys_name_their_block_and_epoch() {
        assert_eq!(block_key_at("s1", 0, "ab"), "scopes/s1/blocks/ab");
        assert_eq!(block_key_at("s1", 7, "ab"), "scopes/s1/blocks/ab.e7");
        for (epoch, sha) in [(0, "ab"), (7, "ab"), (u64::MAX, "cd")] {
            assert_eq!(block_of_key("s1", &block_key_at("s1", epoch, sha)), Some((sha, epoch)));
        }
        // Another scope's key, a metadata object, an epoch that is no number: not a block of s1.
        for key in ["scopes/s10/blocks/ab", "scopes/s1/meta/g1", "scopes/s1/blocks/ab.ex", "scopes/s1/blocks/ab.e0"] {
            assert_eq!(block_of_key("s1", key), None, "{key}");
        }
    }
}
