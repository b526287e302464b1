//! Plain data types of the file engine's public API: attributes, entries, flags and settings.

use std::time::{Duration, SystemTime};

/// Inode number. `ROOT_INO` is the scope's root directory; numbers are never reused.
pub type Ino = u64;
/// Open-file handle number, unique within one engine.
pub type Fh = u64;

pub const ROOT_INO: Ino = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// A named pipe: no content; the kernel serves its I/O.
    Fifo,
    /// A Unix socket node: no content; the kernel serves its I/O.
    Socket,
    /// A character device node: inert (scope mounts are `nodev`), only its number is kept.
    CharDevice,
    /// A block device node: inert (scope mounts are `nodev`), only its number is kept.
    BlockDevice,
}

impl FileKind {
    /// Every kind.
    pub const ALL: [FileKind; 7] = [
        FileKind::File,
        FileKind::Dir,
        FileKind::Symlink,
        FileKind::Fifo,
        FileKind::Socket,
        FileKind::CharDevice,
        FileKind::BlockDevice,
    ];

    /// The kind whose `as_str` is `name`; `None` for any other text.
    pub fn from_name(name: &str) -> Option<FileKind> {
        FileKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            FileKind::Fifo => "fifo",
            FileKind::Socket => "socket",
            FileKind::CharDevice => "char",
            FileKind::BlockDevice => "block",
        }
    }
}

/// Attributes of one inode as the engine sees them (uncommitted writes included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits only (07777).
    pub perm: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// Changes whenever the file's committed content changes.
    pub version: u64,
    /// Device number of a device node (0 otherwise).
    pub rdev: u32,
}

/// Who creates an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// A time to set: a given instant or "now".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(SystemTime),
}

/// The attribute changes of one `setattr`; `None` leaves a field alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// Clear the set-user-ID bit and a group-executable file's set-group-ID bit (after the other
    /// changes): the caller is a truncate without `CAP_FSETID`, or a chown (`privs.rs`).
    pub kill_suidgid: bool,
}

/// How a file is opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenFlags {
    pub write: bool,
    pub truncate: bool,
    /// With `create`: fail with `Exists` if the name exists.
    pub exclusive: bool,
}

/// The result of an open: the handle and whether the kernel may keep its page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub fh: Fh,
    pub keep_cache: bool,
}

/// Rename behaviour (`renameat2` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RenameMode {
    /// Replace an existing target of a compatible kind.
    #[default]
    Replace,
    /// Fail with `Exists` if the target exists.
    NoReplace,
    /// Atomically swap source and target; both must exist.
    Exchange,
}

/// One directory entry with the child's attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub attr: Attr,
    /// Where a paged listing resumes after this entry (`ScopeEngine::readdir_page`).
    pub cursor: u64,
}

/// Filesystem statistics derived from the scope's quota and usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub total_blocks: u64,
    pub free_blocks: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
    pub max_name_len: u32,
}

/// Exact usage of a scope: committed bytes (sum of file sizes and symlink target lengths) and inodes (root excluded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, schemars::JsonSchema)]
pub struct Usage {
    pub files: u64,
    pub bytes: u64,
    pub inodes: u64,
    /// Names beyond an inode's first (hard links); they count against the inode quota too.
    pub links: u64,
}

/// Per-scope limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Quota {
    pub bytes: u64,
    pub inodes: u64,
}

/// Which call is a durability point (fs/SEMANTICS.md, "Durability").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// POSIX: `close()` hands the data to the daemon (it survives a killed daemon) without a disk
    /// flush; `fsync`/`fsyncdir` make everything committed durable and upload the file's blocks.
    /// Uploads after `close()` run in the background. (`"writeback"` is the former name.)
    #[default]
    #[serde(alias = "writeback")]
    Fsync,
    /// `close()` is itself an `fsync`: it returns once the file is durable and uploaded.
    Close,
}

/// Settings shared by every scope's engine.
#[derive(Debug, Clone)]
pub struct StorageSettings {
    pub block_size: u64,
    pub durability: Durability,
    pub cache_max_bytes: u64,
    pub staging_max_bytes: u64,
    pub upload_parallelism: usize,
    /// Upload slots one scope may hold at once (at most `upload_parallelism`): its further uploads
    /// wait for its own, so another scope's fsync never queues behind one scope's backlog.
    pub upload_parallelism_per_scope: usize,
    /// How long a queued block waits before its background upload, unless a whole group is
    /// queued or someone waits for the queue (`upload_delay_ms`).
    pub upload_delay: Duration,
    /// Whether a block a writer has filled is uploaded (to a remote store) while its file is still
    /// being written, instead of at the file's commit (`early_upload`; `early.rs`).
    pub early_upload: bool,
    /// Bound on one object-store request.
    pub store_timeout: Duration,
    /// Attempts of a foreground request (read miss, fsync) before `EIO`.
    pub store_attempts: u32,
    /// Blocks fetched ahead on sequential reads.
    pub readahead_blocks: u64,
    /// Staging bytes one scope may hold (`limits.staging_max_bytes_per_scope`); the global budget
    /// is `staging_max_bytes`.
    pub staging_max_bytes_per_scope: u64,
    /// Components of a path from the scope root (`limits.max_path_depth`).
    pub max_path_depth: u32,
    /// Bytes of a path from the scope root, separators included (`limits.max_path_bytes`).
    pub max_path_bytes: u32,
    /// Entries a recursive listing or recursive delete may visit (`limits.max_walk_entries`).
    pub max_walk_entries: u64,
    /// Bytes of one listing, of one scope's listings, of all listings (`limits.max_listing_bytes`,
    /// `listing_memory_per_scope_bytes`, `listing_memory_max_bytes`).
    pub max_listing_bytes: u64,
    pub listing_memory_per_scope_bytes: u64,
    pub listing_memory_max_bytes: u64,
    /// Extended attributes one inode may carry (`limits.max_xattrs_per_inode`).
    pub max_xattrs_per_inode: u64,
    /// Bytes (names plus values) of one inode's extended attributes (`limits.max_xattr_bytes_per_inode`).
    pub max_xattr_bytes_per_inode: u64,
    /// Names one file may have (`limits.max_links_per_file`).
    pub max_links_per_file: u32,
    /// Scope metadata databases open at once (`limits.max_open_scope_databases`).
    pub max_open_scope_databases: usize,
    /// Largest dirty block kept in memory and journaled inline in the metadata database at
    /// commit (0: every dirty block is a staging file).
    pub inline_block_max_bytes: u64,
    /// Bytes of in-memory dirty blocks across all scopes; past it, blocks go to staging files.
    pub dirty_memory_max_bytes: u64,
    /// Bytes of in-memory dirty blocks one scope may hold (`limits.dirty_memory_per_scope_bytes`).
    pub dirty_memory_per_scope_bytes: u64,
    /// How long a file held open may keep uncommitted changes before they are committed and its
    /// new blocks queued for upload (`dirty_writeback_secs`).
    pub dirty_writeback: Duration,
    /// Bytes of a scope's open-file log past which each change of an open file is committed at
    /// once instead of logged (`limits.open_log_max_bytes_per_scope`).
    pub open_log_max_bytes: u64,
    /// SQLite's heap across the process (every metadata database's page cache, the registry's):
    /// past it page caches recycle their pages instead of growing (a soft limit; 0: none).
    pub metadata_cache_max_bytes: u64,
    /// Bytes of blocks being downloaded from the object store at once (a fetch holds two copies
    /// of its block until it is cached); a reader waits for room, a readahead is skipped.
    pub fetch_memory_max_bytes: u64,
    /// Bytes of those one scope's downloads may hold (`limits.fetch_memory_per_scope_bytes`; at
    /// least one download's): its further readers wait for its own, its readahead is skipped.
    pub fetch_memory_per_scope_bytes: u64,
    /// How long a committed metadata batch may wait before it is shipped to the object store
    /// (`metadata_sync_interval_ms`; `None`: metadata is not shipped, see `ship.rs`).
    pub metadata_sync: Option<Duration>,
    /// Bytes of committed metadata batches one scope, and the whole daemon, may hold waiting to be
    /// shipped (`limits.metadata_queue_per_scope_bytes`, `limits.metadata_queue_max_bytes`); past
    /// either, the scope's queue is dropped for a snapshot.
    pub metadata_queue_per_scope_bytes: u64,
    pub metadata_queue_max_bytes: u64,
}

impl Default for StorageSettings {
    fn default() -> Self {
        let limits = crate::limits::LimitsConfig::default();
        StorageSettings {
            block_size: 4 * 1024 * 1024,
            durability: Durability::Fsync,
            cache_max_bytes: 2 * 1024 * 1024 * 1024,
            staging_max_bytes: 8 * 1024 * 1024 * 1024,
            upload_parallelism: 8,
            upload_parallelism_per_scope: 4,
            upload_delay: Duration::from_secs(1),
            early_upload: true,
            store_timeout: Duration::from_secs(10),
            store_attempts: 3,
            readahead_blocks: 2,
            staging_max_bytes_per_scope: limits.staging_max_bytes_per_scope,
            max_path_depth: limits.max_path_depth,
            max_path_bytes: limits.max_path_bytes,
            max_walk_entries: limits.max_walk_entries,
            max_listing_bytes: limits.max_listing_bytes,
            listing_memory_per_scope_bytes: limits.listing_memory_per_scope_bytes,
            listing_memory_max_bytes: limits.listing_memory_max_bytes,
            max_xattrs_per_inode: limits.max_xattrs_per_inode,
            max_xattr_bytes_per_inode: limits.max_xattr_bytes_per_inode,
            max_links_per_file: limits.max_links_per_file,
            max_open_scope_databases: limits.max_open_scope_databases,
            inline_block_max_bytes: 64 * 1024,
            dirty_memory_max_bytes: 64 * 1024 * 1024,
            dirty_memory_per_scope_bytes: limits.dirty_memory_per_scope_bytes,
            dirty_writeback: Duration::from_secs(30),
            open_log_max_bytes: limits.open_log_max_bytes_per_scope,
            metadata_cache_max_bytes: 256 * 1024 * 1024,
            fetch_memory_max_bytes: 256 * 1024 * 1024,
            fetch_memory_per_scope_bytes: limits.fetch_memory_per_scope_bytes,
            metadata_sync: None,
            metadata_queue_per_scope_bytes: limits.metadata_queue_per_scope_bytes,
            metadata_queue_max_bytes: limits.metadata_queue_max_bytes,
        }
    }
}
