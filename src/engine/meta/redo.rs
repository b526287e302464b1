//! The redo log of a scope's metadata database (`meta.sqlite3-redo`) and its records. A generation
//! of the log (`logfile.rs`: a fresh key per batch, records chained by MACs) holds the mutations of
//! one batch and names the committed state it builds on (`redo_state.state`, a random id that every
//! commit replaces): a replay runs a generation only onto exactly that state, so no record of an
//! earlier batch, of a timeline a power loss rolled back, or of anybody's forging ever runs. A
//! record holds the request that made the mutation (a FUSE request's id, 0 for none), what the
//! request was answered (an inode number, or 0), and the statements it wrote with: ids of the
//! compile-time table (`statements.rs`) and typed values. Logs of the first format (SQL text under
//! a CRC, written by daemons before this one) are read only by `legacy`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rusqlite::types::{Value, ValueRef};

use super::statements::{self, Stmt};
use crate::engine::logfile::{self, Found, LogFile};
use crate::engine::ship::MetaShip;

/// First bytes of a redo log's header (format 2).
pub(crate) const MAGIC: [u8; 8] = *b"SFREDO\x02\x00";

/// The log file of the database at `db`: `<db>-redo`.
pub(crate) fn log_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-redo");
    PathBuf::from(name)
}

/// The redo log of one database and the state of its open batch.
pub(crate) struct Redo {
    pub(super) log: LogFile,
    /// The committed state the open batch builds on (`redo_state.state`).
    pub(super) base: u64,
    /// Mutations recorded in the open batch.
    pub(super) ops: u32,
    /// When the open batch began (`None`: no batch open).
    pub(super) started: Option<Instant>,
    /// The committed state's number in order (`redo_state.ship_seq`).
    pub(super) seq: u64,
    /// Where committed batches go to be shipped to the object store (`None`: not shipped).
    pub(super) ship: Option<Arc<MetaShip>>,
    /// A copy of the open batch's records, for the shipper (kept only while shipping: reading
    /// them back from the log would check every MAC again).
    kept: Vec<Vec<u8>>,
    /// The buffer the next mutation's record is encoded in (handed back after each, so a record
    /// holding a small block's bytes costs no allocation; empty until the first mutation).
    pub(super) spare_record: Vec<u8>,
}

impl Redo {
    /// Opens the log of the database at `db`, whose committed state is `base`; returns it with the
    /// records to replay: those of a generation built on `base`, up to the first that does not
    /// chain.
    pub fn open(db: &Path, base: u64) -> io::Result<(Redo, Vec<Vec<u8>>)> {
        let (mut log, found) = LogFile::open(&log_path(db), MAGIC)?;
        let records = match found {
            Found { parent: Some(p), records } if p == base => records,
            _ => Vec::new(),
        };
        log.begin(base);
        let redo =
            Redo { log, base, ops: 0, started: None, seq: 0, ship: None, kept: Vec::new(), spare_record: Vec::new() };
        Ok((redo, records))
    }

    /// The records of the open batch as the file holds them now (to put a rolled-back batch back).
    pub fn reread(&self) -> io::Result<Vec<Vec<u8>>> {
        let all = std::fs::read(self.log.path())?;
        let found = logfile::parse(&all, &MAGIC);
        if found.parent != Some(self.base) && self.ops > 0 {
            return Err(io::Error::other("the redo log no longer holds the open batch"));
        }
        Ok(if found.parent == Some(self.base) { found.records } else { Vec::new() })
    }

    /// The open batch committed as state `state`, number `seq`: its records are handed to the
    /// shipper (read back before the next generation starts over them; one that cannot be read
    /// makes the shipper take a snapshot instead), and the next batch goes into a new generation.
    pub fn committed_batch(&mut self, state: u64, seq: u64) {
        if let Some(ship) = &self.ship {
            let kept = std::mem::take(&mut self.kept);
            if kept.len() == self.ops as usize {
                ship.batch(seq, state, kept);
            } else {
                match self.reread() {
                    Ok(records) => ship.batch(seq, state, records.iter().map(|r| for_shipping(r)).collect()),
                    Err(e) => ship.lost_batch(seq, state, &e),
                }
            }
        }
        self.seq = seq;
        self.committed(state);
    }

    /// A record appended to the open batch: kept for the shipper (without the bytes of small
    /// blocks), when shipping.
    pub fn keep_for_shipping(&mut self, record: &[u8]) {
        if self.ship.is_some() {
            self.kept.push(for_shipping(record));
        }
    }

    /// Takes back a mutation's record buffer for the next one (not one grown past `KEEP_BYTES`,
    /// the log's own bound: thousands of databases may be open, so a large record's memory is not
    /// held between mutations).
    pub fn give_back(&mut self, mut record: Vec<u8>) {
        if record.capacity() <= logfile::KEEP_BYTES {
            record.clear();
            self.spare_record = record;
        }
    }

    /// The open batch was put back from the log: what it now holds is what is kept.
    pub fn kept_again(&mut self, records: &[Vec<u8>]) {
        if self.ship.is_some() {
            self.kept = records.iter().map(|r| for_shipping(r)).collect();
        }
    }

    /// The batch committed as state `state`: the next batch's records go into a new generation.
    pub fn committed(&mut self, state: u64) {
        self.base = state;
        self.ops = 0;
        self.started = None;
        self.kept.clear();
        self.log.begin(state);
    }
}

/// Value tags of a recorded statement.
const NULL: u8 = 0;
const INTEGER: u8 = 1;
const REAL: u8 = 2;
const TEXT: u8 = 3;
const BLOB: u8 = 4;

/// Bytes at the start of a record: the request and its answer.
pub(crate) const RECORD_HEAD: usize = 16;

/// Starts a record in `out`: room for the request and answer, filled by `finish_record`.
pub(crate) fn start_record(out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&[0u8; RECORD_HEAD]);
}

/// Fills in the request and answer of a record started by `start_record`.
pub(crate) fn finish_record(out: &mut [u8], request: u64, answer: u64) {
    out[..8].copy_from_slice(&request.to_le_bytes());
    out[8..16].copy_from_slice(&answer.to_le_bytes());
}

/// Whether a record holds any statement.
pub(crate) fn has_statements(rec: &[u8]) -> bool {
    rec.len() > RECORD_HEAD
}

/// Appends one statement to a record: its id, then each value (tag and bytes).
pub(crate) fn encode_statement<'v>(
    out: &mut Vec<u8>,
    stmt: &Stmt,
    values: impl ExactSizeIterator<Item = rusqlite::Result<ValueRef<'v>>>,
) -> rusqlite::Result<()> {
    let n = u8::try_from(values.len())
        .map_err(|_| rusqlite::Error::ToSqlConversionFailure("too many values for one statement".into()))?;
    out.extend_from_slice(&stmt.id.to_le_bytes());
    out.push(n);
    for v in values {
        match v? {
            ValueRef::Null => out.push(NULL),
            ValueRef::Integer(i) => {
                out.push(INTEGER);
                out.extend_from_slice(&i.to_le_bytes());
            }
            ValueRef::Real(f) => {
                out.push(REAL);
                out.extend_from_slice(&f.to_le_bytes());
            }
            ValueRef::Text(t) => {
                out.push(TEXT);
                out.extend_from_slice(&(t.len() as u32).to_le_bytes());
                out.extend_from_slice(t);
            }
            ValueRef::Blob(b) => {
                out.push(BLOB);
                out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                out.extend_from_slice(b);
            }
        }
    }
    Ok(())
}

/// One decoded record.
#[derive(Debug, PartialEq)]
pub(crate) struct Record {
    pub request: u64,
    pub answer: u64,
    pub statements: Vec<(&'static Stmt, Vec<Value>)>,
}

fn take<'a>(rec: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, rest) = (rec.get(..n)?, rec.get(n..)?);
    *rec = rest;
    Some(head)
}

fn bytes<'a>(rec: &mut &'a [u8]) -> Option<&'a [u8]> {
    let n = u32::from_le_bytes(take(rec, 4)?.try_into().ok()?) as usize;
    take(rec, n)
}

/// Reads a record back; `None` when it is not one this module wrote (an unknown statement id, a
/// value kind it never writes, bytes left over).
pub(crate) fn decode(mut rec: &[u8]) -> Option<Record> {
    let request = u64::from_le_bytes(take(&mut rec, 8)?.try_into().ok()?);
    let answer = u64::from_le_bytes(take(&mut rec, 8)?.try_into().ok()?);
    let mut out = Vec::new();
    while !rec.is_empty() {
        let id = u16::from_le_bytes(take(&mut rec, 2)?.try_into().ok()?);
        let stmt = statements::by_id(id)?;
        let n = take(&mut rec, 1)?[0];
        let mut values = Vec::with_capacity(n as usize);
        for _ in 0..n {
            values.push(decode_value(&mut rec)?);
        }
        out.push((stmt, values));
    }
    Some(Record { request, answer, statements: out })
}

fn decode_value(rec: &mut &[u8]) -> Option<Value> {
    let tag = take(rec, 1)?[0];
    Some(match tag {
        NULL => Value::Null,
        INTEGER => Value::Integer(i64::from_le_bytes(take(rec, 8)?.try_into().ok()?)),
        REAL => Value::Real(f64::from_le_bytes(take(rec, 8)?.try_into().ok()?)),
        TEXT => Value::Text(String::from_utf8(bytes(rec)?.to_vec()).ok()?),
        BLOB => Value::Blob(bytes(rec)?.to_vec()),
        _ => return None,
    })
}

/// Steps over one value (as `decode_value` reads it, without copying it).
fn skip_value(rec: &mut &[u8]) -> Option<()> {
    match take(rec, 1)?[0] {
        NULL => {}
        INTEGER | REAL => {
            take(rec, 8)?;
        }
        TEXT | BLOB => {
            bytes(rec)?;
        }
        _ => return None,
    }
    Some(())
}

/// Each statement of a record: its id and the bytes it spans; `None` when the record is not one
/// this module wrote.
fn statement_spans(rec: &[u8]) -> Option<Vec<(u16, std::ops::Range<usize>)>> {
    let mut rest = rec.get(RECORD_HEAD..)?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let start = rec.len() - rest.len();
        let id = u16::from_le_bytes(take(&mut rest, 2)?.try_into().ok()?);
        for _ in 0..take(&mut rest, 1)?[0] {
            skip_value(&mut rest)?;
        }
        out.push((id, start..rec.len() - rest.len()));
    }
    Some(out)
}

/// The copy of a record the shipper keeps: `without_inline`'s, or the record as it is.
fn for_shipping(rec: &[u8]) -> Vec<u8> {
    without_inline(rec).unwrap_or_else(|| rec.to_vec())
}

/// A copy of a record without its `STAGE_INLINE` statements (the bytes of small blocks waiting for
/// upload), for the copy shipped to the object store: a file's bytes reach the bucket only as its
/// blocks (`ship.rs`); `None` when the record stages none.
fn without_inline(rec: &[u8]) -> Option<Vec<u8>> {
    let spans = statement_spans(rec)?;
    let staged = |(id, _): &&(u16, std::ops::Range<usize>)| *id == statements::STAGE_INLINE.id;
    if !spans.iter().any(|s| staged(&s)) {
        return None;
    }
    let mut out = rec[..RECORD_HEAD].to_vec();
    for (_, kept) in spans.iter().filter(|s| !staged(s)) {
        out.extend_from_slice(&rec[kept.clone()]);
    }
    Some(out)
}

/// Logs of the first format (2351eb5 and before): records of `(magic, length, epoch, CRC-32)` with
/// SQL text and values, the batch after the committed epoch from offset 0. Read once, when a
/// database last written by such a daemon is opened; a statement whose text is not one of
/// `statements::ALL` is never run: the whole log is refused instead.
pub(crate) mod legacy {
    use super::*;

    const MAGIC: u32 = 0x5346_5244;
    const HEADER: usize = 20;

    /// What a first-format log holds for the batch after `committed`.
    pub(crate) enum Legacy {
        /// The statements of each record, in order (empty: nothing to replay).
        Records(Vec<Vec<(&'static Stmt, Vec<Value>)>>),
        /// A record names a statement outside the table (or cannot be read): nothing is run.
        Refused,
    }

    /// Reads the log image `all` for the batch after `committed`.
    pub(crate) fn read(all: &[u8], committed: u64) -> Legacy {
        let epoch = committed + 1;
        let mut records = Vec::new();
        let mut at = 0;
        while at + HEADER <= all.len() {
            let word = |i: usize| u32::from_le_bytes(all[at + i..at + i + 4].try_into().expect("4 bytes"));
            let (magic, len, crc) = (word(0), word(4) as usize, word(16));
            let record_epoch = u64::from(word(8)) | (u64::from(word(12)) << 32);
            let start = at + HEADER;
            if magic != MAGIC || start + len > all.len() || record_epoch != epoch {
                break;
            }
            let mut h = crc32fast::Hasher::new();
            h.update(&record_epoch.to_le_bytes());
            h.update(&all[start..start + len]);
            if h.finalize() != crc {
                break;
            }
            match decode_v1(&all[start..start + len]) {
                Some(r) => records.push(r),
                None => return Legacy::Refused,
            }
            at = start + len;
        }
        Legacy::Records(records)
    }

    fn decode_v1(mut rec: &[u8]) -> Option<Vec<(&'static Stmt, Vec<Value>)>> {
        let mut out = Vec::new();
        while !rec.is_empty() {
            let sql = std::str::from_utf8(bytes(&mut rec)?).ok()?;
            let stmt = statements::by_text(sql)?;
            let n = u16::from_le_bytes(take(&mut rec, 2)?.try_into().ok()?);
            let mut values = Vec::with_capacity(n as usize);
            for _ in 0..n {
                values.push(decode_value(&mut rec)?);
            }
            out.push((stmt, values));
        }
        Some(out)
    }

    /// A first-format record (for tests): magic, length, epoch, CRC, then SQL texts and values.
    #[cfg(test)]
    pub(crate) fn encode_v1(epoch: u64, statements: &[(&str, Vec<Value>)]) -> Vec<u8> {
        let mut payload = Vec::new();
        for (sql, values) in statements {
            payload.extend_from_slice(&(sql.len() as u32).to_le_bytes());
            payload.extend_from_slice(sql.as_bytes());
            payload.extend_from_slice(&(values.len() as u16).to_le_bytes());
            for v in values {
                match v {
                    Value::Integer(i) => {
                        payload.push(INTEGER);
                        payload.extend_from_slice(&i.to_le_bytes());
                    }
                    Value::Text(t) => {
                        payload.push(TEXT);
                        payload.extend_from_slice(&(t.len() as u32).to_le_bytes());
                        payload.extend_from_slice(t.as_bytes());
                    }
                    Value::Blob(b) => {
                        payload.push(BLOB);
                        payload.extend_from_slice(&(b.len() as u32).to_le_bytes());
                        payload.extend_from_slice(b);
                    }
                    Value::Null => payload.push(NULL),
                    Value::Real(f) => {
                        payload.push(REAL);
                        payload.extend_from_slice(&f.to_le_bytes());
                    }
                }
            }
        }
        let mut h = crc32fast::Hasher::new();
        h.update(&epoch.to_le_bytes());
        h.update(&payload);
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&epoch.to_le_bytes());
        out.extend_from_slice(&h.finalize().to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_with_request_answer_and_typed_values() {
        let mut rec = Vec::new();
        start_record(&mut rec);
        let values =
            vec![Value::Null, Value::Integer(-7), Value::Real(1.5), Value::Text("é".into()), Value::Blob(vec![0, 255])];
        encode_statement(&mut rec, &statements::INSERT_INODE, values.iter().map(|v| Ok(ValueRef::from(v)))).unwrap();
        encode_statement(&mut rec, &statements::USAGE_LINK_ADDED, std::iter::empty()).unwrap();
        finish_record(&mut rec, 42, 7);
        let r = decode(&rec).unwrap();
        assert_eq!((r.request, r.answer), (42, 7));
        assert_eq!(r.statements.len(), 2);
        assert_eq!(r.statements[0], (&statements::INSERT_INODE, values));
        assert_eq!(r.statements[1], (&statements::USAGE_LINK_ADDED, Vec::new()));
        assert!(decode(&rec[..rec.len() - 1]).is_none(), "a cut record does not decode");
        let mut unknown = rec.clone();
        unknown[RECORD_HEAD] = 0xee; // an id outside the table
        unknown[RECORD_HEAD + 1] = 0xee;
        assert!(decode(&unknown).is_none(), "an unknown statement id is no record");
    }

    #[test]
    fn a_shipped_copy_leaves_out_the_inline_bytes_and_nothing_else() {
        let stage = |rec: &mut Vec<u8>, sha: &str, data: &[u8]| {
            let values = [Value::Text(sha.into()), Value::Blob(data.to_vec())];
            encode_statement(rec, &statements::STAGE_INLINE, values.iter().map(|v| Ok(ValueRef::from(v)))).unwrap();
        };
        let insert = |rec: &mut Vec<u8>, sha: &str| {
            let values = [Value::Text(sha.into()), Value::Integer(3)];
            encode_statement(rec, &statements::INSERT_BLOCK, values.iter().map(|v| Ok(ValueRef::from(v)))).unwrap();
        };
        let mut rec = Vec::new();
        start_record(&mut rec);
        stage(&mut rec, "aa", b"first");
        insert(&mut rec, "aa");
        stage(&mut rec, "bb", b"second");
        insert(&mut rec, "bb");
        finish_record(&mut rec, 9, 4);
        let stripped = without_inline(&rec).unwrap();
        let r = decode(&stripped).unwrap();
        assert_eq!((r.request, r.answer), (9, 4));
        let whole = decode(&rec).unwrap();
        assert_eq!(r.statements, vec![whole.statements[1].clone(), whole.statements[3].clone()], "the rest as it was");
        assert!(!stripped.windows(5).any(|w| w == b"first") && !stripped.windows(6).any(|w| w == b"second"));
        assert_eq!(without_inline(&stripped), None, "nothing left to leave out");
        assert_eq!(without_inline(&rec[..rec.len() - 1]), None, "a cut record is not rewritten");
    }

    #[test]
    fn a_first_format_log_runs_only_statements_of_the_table() {
        let good = legacy::encode_v1(
            3,
            &[("UPDATE usage SET links = links + 1 WHERE id = 1", vec![]), (statements::SET_NAME.sql, vec![])],
        );
        let forged = legacy::encode_v1(3, &[("ATTACH DATABASE '/tmp/elsewhere' AS x", vec![])]);
        match legacy::read(&good, 2) {
            legacy::Legacy::Records(r) => assert_eq!(r.len(), 1),
            legacy::Legacy::Refused => panic!("a log of table statements is read"),
        }
        let mut both = good.clone();
        both.extend_from_slice(&forged);
        assert!(matches!(legacy::read(&both, 2), legacy::Legacy::Refused), "one foreign statement refuses all");
        match legacy::read(&good, 3) {
            legacy::Legacy::Records(r) => assert!(r.is_empty(), "another epoch is not replayed"),
            legacy::Legacy::Refused => panic!(),
        }
    }
}
