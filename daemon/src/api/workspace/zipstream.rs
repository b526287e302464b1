//! The streaming zip of a workspace: written on a blocking thread into a bounded channel that feeds the
//! HTTP body. Only regular files and directories go in; symlinks and special files are left out, so
//! no link is ever followed.
//!
//! Names and modes are made safe for any extractor (review L1): `\` and `:` (a separator and a drive
//! prefix elsewhere) become `_`, bytes that are not UTF-8 become `%XX`, a name that is then taken
//! already in its directory gets a `~N` suffix (distinct files stay distinct and the stream never
//! aborts on a duplicate), and modes keep only their permission bits (no setuid, setgid, sticky).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::body::Bytes;
use scopefs::engine::{Attr, FileKind, PathEntry, ScopeEngine, ROOT_INO};
use tokio::sync::mpsc;

use super::CHUNK;
use crate::services::files::EngineFileReader;

/// Buffers zip output and hands it to the HTTP body in chunks.
pub(super) struct ChannelWriter {
    pub(super) tx: mpsc::Sender<io::Result<Bytes>>,
    pub(super) buf: Vec<u8>,
}

impl ChannelWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx.blocking_send(Ok(chunk)).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "client went away"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// A zip timestamp of a file's mtime (UTC); out-of-range times get the format's default.
fn zip_time(attr: &Attr) -> zip::DateTime {
    let secs = attr.mtime.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = ((rem / 3600) as u8, (rem % 3600 / 60) as u8, (rem % 60) as u8);
    u16::try_from(year)
        .ok()
        .and_then(|y| zip::DateTime::from_date_and_time(y, month, day, h, m, s).ok())
        .unwrap_or_default()
}

/// A name component as it goes into the zip: `\` and `:` become `_`, bytes that are not UTF-8 `%XX`.
fn zip_component(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for chunk in raw.utf8_chunks() {
        out.extend(chunk.valid().chars().map(|c| if c == '\\' || c == ':' { '_' } else { c }));
        for b in chunk.invalid() {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The zip path of `name` in directory `dir` (`""` at the top), made unique among `used` with a
/// `~N` suffix before the extension.
fn unique_path(dir: &str, name: &str, used: &mut HashSet<String>) -> String {
    let join = |n: &str| if dir.is_empty() { n.to_string() } else { format!("{dir}/{n}") };
    let mut path = join(name);
    let (stem, ext) = match name.rfind('.') {
        Some(i) if i > 0 => name.split_at(i),
        _ => (name, ""),
    };
    let mut n = 1u64;
    while used.contains(&path) {
        path = join(&format!("{stem}~{n}{ext}"));
        n += 1;
    }
    used.insert(path.clone());
    path
}

/// One entry of the zip: its path in the archive and its attributes.
struct ZipItem {
    path: String,
    attr: Attr,
}

/// The regular files and directories of the scope, depth first in name order, with safe unique zip
/// paths; at most `budget` entries are visited (the size of the listing made before the answer
/// started, which `max_walk_entries` bounded).
fn zip_items(engine: &ScopeEngine, budget: usize) -> Result<Vec<ZipItem>, io::Error> {
    let mut used = HashSet::new();
    let mut items = Vec::new();
    let mut seen = 0usize;
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((ino, dir)) = stack.pop() {
        let mut entries = match engine.readdir(ino) {
            Ok(e) => e,
            // Removed since it was listed: leave it out.
            Err(scopefs::engine::EngineError::NotFound | scopefs::engine::EngineError::NotDir) if ino != ROOT_INO => {
                continue
            }
            Err(err) => return Err(io::Error::other(err)),
        };
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let mut subdirs = Vec::new();
        for e in entries {
            if !matches!(e.attr.kind, FileKind::Dir | FileKind::File) {
                continue;
            }
            seen += 1;
            if seen > budget {
                return Ok(items);
            }
            let path = unique_path(&dir, &zip_component(&e.name), &mut used);
            if e.attr.kind == FileKind::Dir {
                subdirs.push((e.attr.ino, path.clone()));
            }
            items.push(ZipItem { path, attr: e.attr });
        }
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(items)
}

/// Writes the zip of the scope (regular files and directories only; symlinks and special files are
/// left out, so no link is ever followed). `entries` is the listing made before the answer started:
/// its length bounds the walk; names are read again raw so that they can be escaped (see the module
/// docs).
pub(super) fn write_zip(engine: &Arc<ScopeEngine>, entries: &[PathEntry], out: ChannelWriter) -> Result<(), io::Error> {
    use zip::write::SimpleFileOptions;
    let items = zip_items(engine, entries.len())?;
    let mut zip = zip::ZipWriter::new_stream(out);
    for e in &items {
        let mode = e.attr.perm & 0o777;
        let base = SimpleFileOptions::default().last_modified_time(zip_time(&e.attr)).unix_permissions(mode);
        match e.attr.kind {
            FileKind::Dir => zip.add_directory(format!("{}/", e.path), base).map_err(io::Error::other)?,
            FileKind::File => {
                let mut reader = match EngineFileReader::open(engine.clone(), e.attr.ino, 0, u64::MAX) {
                    Ok(r) => r,
                    // Removed since the listing: leave it out.
                    Err(scopefs::engine::EngineError::NotFound) => continue,
                    Err(err) => return Err(io::Error::other(err)),
                };
                let opts =
                    base.compression_method(zip::CompressionMethod::Deflated).large_file(e.attr.size >= 0xFFFF_FFFF);
                zip.start_file(e.path.as_str(), opts).map_err(io::Error::other)?;
                io::copy(&mut reader, &mut zip)?;
            }
            _ => {}
        }
    }
    let mut out = zip.finish().map_err(io::Error::other)?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zip_times_are_civil_utc() {
        use std::time::{Duration, SystemTime};
        let mut attr = Attr {
            ino: 2,
            kind: FileKind::File,
            size: 0,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            ctime: SystemTime::UNIX_EPOCH,
            version: 1,
            rdev: 0,
        };
        // 2023-11-14 22:13:20 UTC
        let t = zip_time(&attr);
        assert_eq!((t.year(), t.month(), t.day(), t.hour(), t.minute(), t.second()), (2023, 11, 14, 22, 13, 20));
        attr.mtime = SystemTime::UNIX_EPOCH;
        assert_eq!(zip_time(&attr), zip::DateTime::default());
    }

    /// Review L1: no separator or drive prefix of another system survives, names that are not
    /// UTF-8 are escaped, and names equal after that stay distinct.
    #[test]
    fn zip_names_are_safe_and_unique() {
        assert_eq!(zip_component(b"..\\..\\x.bat"), ".._.._x.bat");
        assert_eq!(zip_component(b"C:evil"), "C_evil");
        assert_eq!(zip_component(b"a\xffb\xfe"), "a%FFb%FE");
        assert_eq!(zip_component("é.txt".as_bytes()), "é.txt");
        let mut used = HashSet::new();
        assert_eq!(unique_path("", "a_b.txt", &mut used), "a_b.txt");
        assert_eq!(unique_path("", "a_b.txt", &mut used), "a_b~1.txt");
        assert_eq!(unique_path("", "a_b.txt", &mut used), "a_b~2.txt");
        assert_eq!(unique_path("d", "a_b.txt", &mut used), "d/a_b.txt");
        assert_eq!(unique_path("", ".env", &mut used), ".env");
        assert_eq!(unique_path("", ".env", &mut used), ".env~1");
    }
}
