//! The streaming zip of a workspace: written on a blocking thread into a bounded channel that feeds the
//! HTTP body. Only regular files and directories go in; symlinks and special files are left out, so
//! no link is ever followed.

use std::io::{self, Write};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::body::Bytes;
use scopefs::engine::{Attr, FileKind, PathEntry, ScopeEngine};
use tokio::sync::mpsc;

use super::CHUNK;
use crate::service::EngineFileReader;

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

/// Writes the zip of `entries` (regular files and directories only; symlinks and special files are
/// left out, so no link is ever followed).
pub(super) fn write_zip(engine: &Arc<ScopeEngine>, entries: &[PathEntry], out: ChannelWriter) -> Result<(), io::Error> {
    use zip::write::SimpleFileOptions;
    let mut zip = zip::ZipWriter::new_stream(out);
    for e in entries {
        let base = SimpleFileOptions::default().last_modified_time(zip_time(&e.attr)).unix_permissions(e.attr.perm);
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
        };
        // 2023-11-14 22:13:20 UTC
        let t = zip_time(&attr);
        assert_eq!((t.year(), t.month(), t.day(), t.hour(), t.minute(), t.second()), (2023, 11, 14, 22, 13, 20));
        attr.mtime = SystemTime::UNIX_EPOCH;
        assert_eq!(zip_time(&attr), zip::DateTime::default());
    }
}
