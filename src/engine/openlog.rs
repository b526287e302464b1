//! The open-file log of a scope (`staging/<id>/open-log`): what its open files were told was written
//! and not yet committed. Every change of an open file's uncommitted state — a write, a size change,
//! a zeroed range — is appended (one write, no flush; `logfile.rs` framing) before the request is
//! answered, so a worker killed while programs hold files open loses nothing they wrote: the next
//! process (to which the kernel hands the same open files) replays the log onto each file's
//! committed version and commits the result before it serves anything (`ScopeEngine::recover`).
//!
//! A record names the file's committed version it builds on; a replay applies an inode's records
//! from the first one built on the version the database holds (earlier ones are in it already,
//! a commit lost to a power loss brings them back), and nothing for a version it does not hold. The
//! changes are blind (they set bytes or a size whatever was there), so applying again what a commit
//! already holds changes nothing. Bytes that went to a block's working file in staging (which
//! survives the process) are named, not copied: a replay reads them back from that file. When no
//! open file holds uncommitted changes the next record starts a new generation over the old ones.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use parking_lot::Mutex;

use super::logfile::LogFile;
use super::types::Ino;

/// The log's file name in a scope's staging directory.
pub(crate) const OPEN_LOG: &str = "open-log";
/// First bytes of the log's header.
const MAGIC: [u8; 8] = *b"SFOPEN\x01\x00";

/// One change of an open file's uncommitted state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change<'a> {
    /// `data` written at `offset` (a block kept in memory).
    Write { offset: u64, data: Cow<'a, [u8]> },
    /// `len` bytes written at `offset` into the block whose working file in `open/` is `file`.
    WriteIn { offset: u64, len: u64, file: Cow<'a, str> },
    /// The size became `size` (truncate, or growth by `fallocate`).
    SetSize { size: u64 },
    /// `[start, end)` reads as zeros (`fallocate` punching or zeroing).
    Zero { start: u64, end: u64 },
}

/// A change of inode `ino`, built on its committed `version`, leaving its mtime at `mtime_ns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry<'a> {
    pub ino: Ino,
    pub version: u64,
    pub mtime_ns: i64,
    pub change: Change<'a>,
}

const WRITE: u8 = 1;
const WRITE_IN: u8 = 2;
const SET_SIZE: u8 = 3;
const ZERO: u8 = 4;

/// Appends one change to a record: its length, then the change.
fn encode(e: &Entry<'_>, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend_from_slice(&[0u8; 4]);
    let kind = match &e.change {
        Change::Write { .. } => WRITE,
        Change::WriteIn { .. } => WRITE_IN,
        Change::SetSize { .. } => SET_SIZE,
        Change::Zero { .. } => ZERO,
    };
    out.push(kind);
    out.extend_from_slice(&e.ino.to_le_bytes());
    out.extend_from_slice(&e.version.to_le_bytes());
    out.extend_from_slice(&e.mtime_ns.to_le_bytes());
    match &e.change {
        Change::Write { offset, data } => {
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(data);
        }
        Change::WriteIn { offset, len, file } => {
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(file.as_bytes());
        }
        Change::SetSize { size } => out.extend_from_slice(&size.to_le_bytes()),
        Change::Zero { start, end } => {
            out.extend_from_slice(&start.to_le_bytes());
            out.extend_from_slice(&end.to_le_bytes());
        }
    }
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// The changes of one record (one request's: all or none of them are replayed); `None` when the
/// record is not one this module wrote.
fn decode_all(mut rec: &[u8]) -> Option<Vec<Entry<'static>>> {
    let mut out = Vec::new();
    while !rec.is_empty() {
        let len = u32::from_le_bytes(rec.get(..4)?.try_into().ok()?) as usize;
        out.push(decode(rec.get(4..4 + len)?)?);
        rec = &rec[4 + len..];
    }
    Some(out)
}

fn decode(rec: &[u8]) -> Option<Entry<'static>> {
    let u64_at = |at: usize| rec.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    let (kind, ino, version) = (*rec.first()?, u64_at(1)?, u64_at(9)?);
    let mtime_ns = u64_at(17)? as i64;
    let change = match kind {
        WRITE => Change::Write { offset: u64_at(25)?, data: Cow::Owned(rec.get(33..)?.to_vec()) },
        WRITE_IN => {
            let file = String::from_utf8(rec.get(41..)?.to_vec()).ok()?;
            // Working files are named `<ino>.<block>.<number>`: nothing else is ever read.
            let parts: Vec<&str> = file.split('.').collect();
            if parts.len() != 3 || !parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) {
                return None;
            }
            Change::WriteIn { offset: u64_at(25)?, len: u64_at(33)?, file: Cow::Owned(file) }
        }
        SET_SIZE if rec.len() == 33 => Change::SetSize { size: u64_at(25)? },
        ZERO if rec.len() == 41 => Change::Zero { start: u64_at(25)?, end: u64_at(33)? },
        _ => return None,
    };
    Some(Entry { ino, version, mtime_ns, change })
}

/// The open-file log of one scope.
pub(crate) struct OpenLog {
    inner: Mutex<Inner>,
}

struct Inner {
    /// Opened on the first change (a scope nobody writes to holds no descriptor for it).
    log: Option<LogFile>,
    /// Open files with uncommitted changes.
    dirty: usize,
    buf: Vec<u8>,
}

impl OpenLog {
    pub fn new() -> OpenLog {
        OpenLog { inner: Mutex::new(Inner { log: None, dirty: 0, buf: Vec::new() }) }
    }

    /// An open file now has uncommitted changes (it had none): the log keeps its generation until
    /// the file `settled`.
    pub fn dirtied(&self) {
        self.inner.lock().dirty += 1;
    }

    /// Appends the changes one request made to a file that is `dirtied`, as one record: a replay
    /// applies all of them or none.
    pub fn append(&self, staging: &Path, entries: &[Entry<'_>]) -> io::Result<()> {
        let mut inner = self.inner.lock();
        let Inner { log, buf, .. } = &mut *inner;
        if log.is_none() {
            let (mut opened, _) = LogFile::open(&staging.join(OPEN_LOG), MAGIC)?;
            opened.begin(boot_id());
            *log = Some(opened);
        }
        buf.clear();
        for entry in entries {
            encode(entry, buf);
        }
        let written = log.as_mut().map_or(Ok(()), |l| l.append(buf));
        if buf.capacity() > 64 << 10 {
            *buf = Vec::new();
        }
        written
    }

    /// Open files with changes not committed yet (each `dirtied` and not yet `settled`).
    pub fn dirty_files(&self) -> usize {
        self.inner.lock().dirty
    }

    /// Bytes of the current generation.
    pub fn generation_bytes(&self) -> u64 {
        self.inner.lock().log.as_ref().map_or(0, LogFile::len)
    }

    /// An open file's changes were committed, or given up (`was_dirty`: it had any); with none
    /// left anywhere, the next change starts a new generation.
    pub fn settled(&self, was_dirty: bool) {
        if !was_dirty {
            return;
        }
        let mut inner = self.inner.lock();
        inner.dirty = inner.dirty.saturating_sub(1);
        if inner.dirty == 0 {
            if let Some(log) = inner.log.as_mut() {
                log.begin(boot_id());
            }
        }
    }
}

impl OpenLog {
    /// Empties the log when no open file has uncommitted changes (the engine closes, or hands its
    /// mounts over with everything committed): a restart then need not open the scope at once.
    /// Not flushed: records that come back after a power loss name versions that moved on, or
    /// changes the database lost with them.
    pub fn empty_if_settled(&self) -> io::Result<()> {
        let mut inner = self.inner.lock();
        if inner.dirty > 0 {
            return Ok(());
        }
        match inner.log.as_mut() {
            Some(log) => log.clear(boot_id()),
            None => Ok(()),
        }
    }
}

/// The changes a log at `path` holds, by inode, each inode's in order; nothing when the log was
/// written before the host last started: after a reboot no program holds a file open any more,
/// and what was not flushed (the log itself, the working files its records name) cannot be
/// trusted.
pub(crate) fn read(path: &Path) -> io::Result<BTreeMap<Ino, Vec<Entry<'static>>>> {
    let all = match std::fs::read(path) {
        Ok(all) => all,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    let mut by_ino: BTreeMap<Ino, Vec<Entry<'static>>> = BTreeMap::new();
    let found = super::logfile::parse(&all, &MAGIC);
    if found.parent != Some(boot_id()) {
        return Ok(by_ino);
    }
    for rec in found.records {
        match decode_all(&rec) {
            Some(entries) => {
                for e in entries {
                    by_ino.entry(e.ino).or_default().push(e);
                }
            }
            None => break,
        }
    }
    Ok(by_ino)
}

/// This boot of the host (`/proc/sys/kernel/random/boot_id`, or a test's `testhooks::with_boot`).
fn boot_id() -> u64 {
    if let Some(id) = crate::testhooks::boot_override() {
        return id;
    }
    static BOOT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let hex: String = text.chars().filter(char::is_ascii_hexdigit).take(16).collect();
        // Without a boot id every log counts as this boot's (a process crash is the common case).
        u64::from_str_radix(&hex, 16).unwrap_or(1).max(1)
    })
}

/// Of an inode's changes, those a replay applies onto committed version `version`: from the first
/// one built on it (none when no change is).
pub(crate) fn to_apply<'e>(entries: &'e [Entry<'static>], version: u64) -> &'e [Entry<'static>] {
    match entries.iter().position(|e| e.version == version) {
        Some(first) => &entries[first..],
        None => &[],
    }
}

/// Empties the log at `path` and makes that durable (after a replay: what it held is committed, and
/// must never come back after a power loss onto a database that moved on).
pub(crate) fn clear(path: &Path) -> io::Result<()> {
    match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(f) => {
            f.set_len(0)?;
            f.sync_all()
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ino: Ino, version: u64, change: Change<'static>) -> Entry<'static> {
        Entry { ino, version, mtime_ns: -5, change }
    }

    #[test]
    fn changes_round_trip_by_inode_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let log = OpenLog::new();
        let changes = [
            entry(3, 1, Change::Write { offset: 9, data: Cow::Borrowed(b"abc") }),
            entry(4, 0, Change::WriteIn { offset: 4096, len: 100, file: Cow::Borrowed("4.1.123") }),
            entry(3, 1, Change::SetSize { size: 2 }),
            entry(3, 2, Change::Zero { start: 0, end: 1 }),
        ];
        log.dirtied();
        log.dirtied();
        log.append(dir.path(), &changes[..2]).unwrap();
        for c in &changes[2..] {
            log.append(dir.path(), std::slice::from_ref(c)).unwrap();
        }
        let found = read(&dir.path().join(OPEN_LOG)).unwrap();
        assert_eq!(found[&3], vec![changes[0].clone(), changes[2].clone(), changes[3].clone()]);
        assert_eq!(found[&4], vec![changes[1].clone()]);
        assert_eq!(to_apply(&found[&3], 1).len(), 3, "from the first change on the held version");
        assert_eq!(to_apply(&found[&3], 2).len(), 1, "a committed version holds the changes before it");
        assert!(to_apply(&found[&3], 7).is_empty(), "nothing onto a version no change builds on");
    }

    #[test]
    fn with_no_open_file_dirty_the_next_change_starts_a_new_generation() {
        let dir = tempfile::tempdir().unwrap();
        let log = OpenLog::new();
        for ino in [3, 4] {
            log.dirtied();
            log.append(dir.path(), &[entry(ino, 0, Change::SetSize { size: 1 })]).unwrap();
        }
        log.settled(true);
        log.dirtied();
        log.append(dir.path(), &[entry(5, 0, Change::SetSize { size: 1 })]).unwrap();
        assert_eq!(read(&dir.path().join(OPEN_LOG)).unwrap().len(), 3, "file 4 still dirty: one generation");
        log.settled(true);
        log.settled(true);
        log.dirtied();
        log.append(dir.path(), &[entry(6, 0, Change::SetSize { size: 1 })]).unwrap();
        let found = read(&dir.path().join(OPEN_LOG)).unwrap();
        assert_eq!(found.keys().copied().collect::<Vec<_>>(), vec![6]);
        clear(&dir.path().join(OPEN_LOG)).unwrap();
        assert!(read(&dir.path().join(OPEN_LOG)).unwrap().is_empty());
    }

    #[test]
    fn a_working_file_name_is_never_a_path() {
        let mut buf = Vec::new();
        for bad in ["../../etc/passwd", "..", "1..2", "1.2", "1.2.3.4", ""] {
            buf.clear();
            encode(&entry(1, 0, Change::WriteIn { offset: 0, len: 1, file: Cow::Borrowed(bad) }), &mut buf);
            assert_eq!(decode_all(&buf), None, "{bad}");
        }
    }

    #[test]
    fn a_log_of_an_earlier_boot_is_never_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let log = OpenLog::new();
        log.dirtied();
        crate::testhooks::with_boot(7, || log.append(dir.path(), &[entry(3, 0, Change::SetSize { size: 1 })])).unwrap();
        let path = dir.path().join(OPEN_LOG);
        assert_eq!(crate::testhooks::with_boot(7, || read(&path)).unwrap().len(), 1, "the same boot replays");
        assert!(crate::testhooks::with_boot(8, || read(&path)).unwrap().is_empty(), "after a reboot nothing");
    }
}
