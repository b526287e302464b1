//! The streaming zip of a workspace: written on a blocking thread into a bounded channel that feeds the
//! HTTP body. Only regular files and directories go in; symlinks and special files are left out, so
//! no link is ever followed.
//!
//! Names and modes are made safe for any extractor (review L1): `\` and `:` (a separator and a drive
//! prefix elsewhere), `%` itself and bytes that are not UTF-8 are percent-escaped (`%5C`, `%3A`,
//! `%25`, `%XX`). The escaping is injective, so names distinct in a directory stay distinct in the
//! zip without any search for a free name: the walk costs one step per entry whatever the names
//! (review N3: a search for a free suffix was quadratic in colliding names). Modes keep only their
//! permission bits (no setuid, setgid, sticky). The walk stops as soon as the client goes away.

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
        self.tx.blocking_send(Ok(chunk)).map_err(|_| client_gone())
    }
}

fn client_gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "client went away")
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

/// A name component as it goes into the zip: `%`, `\` and `:` and bytes that are not UTF-8 become
/// `%XX` (injective: two names differ in the zip exactly when they differ in the scope).
fn zip_component(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for chunk in raw.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '%' | '\\' | ':' => {
                    let _ = write!(out, "%{:02X}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// One entry of the zip: its path in the archive and its attributes.
struct ZipItem {
    path: String,
    attr: Attr,
}

/// The regular files and directories of the scope, depth first in name order, with safe zip paths
/// (distinct, see `zip_component`); at most `budget` entries are visited (the size of the listing
/// made before the answer started, which `max_walk_entries` bounded). Stops with `BrokenPipe` once
/// `gone()` says the client went away.
fn zip_items(engine: &ScopeEngine, budget: usize, gone: impl Fn() -> bool) -> Result<Vec<ZipItem>, io::Error> {
    let mut items = Vec::new();
    let mut seen = 0usize;
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((ino, dir)) = stack.pop() {
        if gone() {
            return Err(client_gone());
        }
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
            if seen.is_multiple_of(1024) && gone() {
                return Err(client_gone());
            }
            let name = zip_component(&e.name);
            let path = if dir.is_empty() { name } else { format!("{dir}/{name}") };
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
    let items = zip_items(engine, entries.len(), || out.tx.is_closed())?;
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

    /// Review L1: no separator or drive prefix of another system survives and names that are not
    /// UTF-8 are escaped; review N3: the escaping is injective, so no name needs a free suffix.
    #[test]
    fn zip_names_are_safe_and_distinct() {
        assert_eq!(zip_component(b"..\\..\\x.bat"), "..%5C..%5Cx.bat");
        assert_eq!(zip_component(b"C:evil"), "C%3Aevil");
        assert_eq!(zip_component(b"a\xffb\xfe"), "a%FFb%FE");
        assert_eq!(zip_component(b"100%"), "100%25");
        assert_eq!(zip_component("é.txt".as_bytes()), "é.txt");
        // Every name of up to four bytes over an alphabet of the escaped characters, their
        // escapes' characters and a byte that is not UTF-8 maps to its own zip name.
        let alphabet: &[u8] = b"%\\:_5C3A\xff";
        let mut names = vec![Vec::new()];
        let mut seen = std::collections::HashMap::new();
        for _ in 0..4 {
            names = names.iter().flat_map(|n| alphabet.iter().map(move |&b| [n.as_slice(), &[b]].concat())).collect();
            for n in &names {
                let z = zip_component(n);
                assert!(!z.contains('\\') && !z.contains(':') && !z.contains('/'), "{z:?}");
                if let Some(other) = seen.insert(z.clone(), n.clone()) {
                    panic!("{other:?} and {n:?} both become {z:?}");
                }
            }
        }
        assert_eq!(seen.len(), (1..=4).map(|k| alphabet.len().pow(k)).sum::<usize>());
    }
}
