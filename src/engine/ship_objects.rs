//! What a scope's metadata objects in the bucket are (`ship.rs` puts them, `restore.rs` reads
//! them): their keys, which name what each holds, the bytes of a log object, and the compression
//! every object is put with.

use std::borrow::Cow;
use std::io::{Read, Write};

/// First bytes of a log object.
const LOG_MAGIC: [u8; 8] = *b"SFSHIP\x01\x00";
/// First bytes of a compressed object (a log or a snapshot); then its length inflated (8 bytes,
/// little-endian), then one raw DEFLATE stream. Objects without it (what daemons before it put)
/// are read as they are: a log starts with `LOG_MAGIC`, a snapshot with SQLite's header.
const DEFLATED_MAGIC: [u8; 8] = *b"SFZDEF\x01\x00";
/// Largest length an object may declare inflated (an object declaring more is damaged): a log
/// object holds at most a scope's queue (`limits.metadata_queue_per_scope_bytes`), a snapshot one
/// database, which the shipper held in memory whole.
const MAX_INFLATED: u64 = 16 << 30;

/// One committed batch: its number, its state id and its redo records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batch {
    pub seq: u64,
    pub state: u64,
    pub records: Vec<Vec<u8>>,
}

impl Batch {
    pub(crate) fn bytes(&self) -> u64 {
        self.records.iter().map(|r| r.len() as u64 + 4).sum::<u64>() + 20
    }
}

/// What one shipped object is, from its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shipped {
    Snapshot { gen: u64, seq: u64, state: u64 },
    Log { gen: u64, first: u64, last: u64, state: u64 },
}

impl Shipped {
    pub fn gen(&self) -> u64 {
        match *self {
            Shipped::Snapshot { gen, .. } | Shipped::Log { gen, .. } => gen,
        }
    }

    /// The batch the object ends at, and its state.
    pub fn head(&self) -> (u64, u64) {
        match *self {
            Shipped::Snapshot { seq, state, .. } => (seq, state),
            Shipped::Log { last, state, .. } => (last, state),
        }
    }

    pub fn key(&self, scope: &str) -> String {
        match *self {
            Shipped::Snapshot { gen, seq, state } => format!("{}g{gen:016x}/s{seq:016x}-{state:016x}", prefix(scope)),
            Shipped::Log { gen, first, last, state } => {
                format!("{}g{gen:016x}/l{first:016x}-{last:016x}-{state:016x}", prefix(scope))
            }
        }
    }

    /// The object a key names (`None`: not a key this module writes).
    pub fn parse(scope: &str, key: &str) -> Option<Shipped> {
        let rest = key.strip_prefix(&prefix(scope))?;
        let (g, name) = rest.split_once('/')?;
        let hex = |s: &str| (s.len() == 16).then(|| u64::from_str_radix(s, 16).ok()).flatten();
        let gen = hex(g.strip_prefix('g')?)?;
        if let Some(s) = name.strip_prefix('s') {
            let (seq, state) = s.split_once('-')?;
            return Some(Shipped::Snapshot { gen, seq: hex(seq)?, state: hex(state)? });
        }
        let mut parts = name.strip_prefix('l')?.split('-');
        let (first, last, state) = (hex(parts.next()?)?, hex(parts.next()?)?, hex(parts.next()?)?);
        (parts.next().is_none() && first <= last).then_some(Shipped::Log { gen, first, last, state })
    }
}

/// Prefix of every metadata object of a scope.
pub(crate) fn prefix(scope: &str) -> String {
    format!("{}meta/", crate::store::scope_prefix(scope))
}

/// A log object's bytes: magic, batches, and a BLAKE3 of all before it (a torn or altered object
/// is refused whole).
pub(crate) fn encode_log(batches: &[Batch]) -> Vec<u8> {
    let mut out = Vec::with_capacity(batches.iter().map(Batch::bytes).sum::<u64>() as usize + 44);
    out.extend_from_slice(&LOG_MAGIC);
    out.extend_from_slice(&(batches.len() as u32).to_le_bytes());
    for b in batches {
        out.extend_from_slice(&b.seq.to_le_bytes());
        out.extend_from_slice(&b.state.to_le_bytes());
        out.extend_from_slice(&(b.records.len() as u32).to_le_bytes());
        for r in &b.records {
            out.extend_from_slice(&(r.len() as u32).to_le_bytes());
            out.extend_from_slice(r);
        }
    }
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    out
}

/// An object's bytes as they are put: `raw` compressed (DEFLATE at its fastest level: the records'
/// hex digests, names and statement ids shrink 3–5×, at about 290 MB/s here).
pub(crate) fn deflate(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() / 3 + 64);
    out.extend_from_slice(&DEFLATED_MAGIC);
    out.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    let mut encoder = flate2::write::DeflateEncoder::new(out, flate2::Compression::fast());
    // Writing into a Vec cannot fail.
    let written = encoder.write_all(raw).and_then(|()| encoder.finish());
    written.expect("compressing into memory")
}

/// An object's bytes as `deflate` took them (an object put without compression, as they are);
/// `None` when its stream is damaged or does not inflate to exactly the length it declares.
pub(crate) fn inflate(body: &[u8]) -> Option<Cow<'_, [u8]>> {
    let Some(rest) = body.strip_prefix(&DEFLATED_MAGIC) else { return Some(Cow::Borrowed(body)) };
    let (len, stream) = rest.split_first_chunk::<8>()?;
    let len = u64::from_le_bytes(*len);
    if len > MAX_INFLATED {
        return None;
    }
    let mut out = Vec::new();
    // One byte past the declared length shows an object that inflates to more.
    flate2::read::DeflateDecoder::new(stream).take(len + 1).read_to_end(&mut out).ok()?;
    (out.len() as u64 == len).then_some(Cow::Owned(out))
}

/// The batches of a log object; `None` when it is not one `encode_log` wrote, whole.
pub(crate) fn decode_log(all: &[u8]) -> Option<Vec<Batch>> {
    let (body, sum) = all.split_at(all.len().checked_sub(32)?);
    if blake3::hash(body).as_bytes() != sum || body.get(..8)? != LOG_MAGIC {
        return None;
    }
    let mut at = 8usize;
    let mut take = |n: usize| {
        let s = body.get(at..at + n);
        at += n;
        s
    };
    let u32_of = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
    let u64_of = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let count = u32_of(take(4)?);
    let mut batches = Vec::new();
    for _ in 0..count {
        let (seq, state) = (u64_of(take(8)?), u64_of(take(8)?));
        let n = u32_of(take(4)?);
        let mut records = Vec::new();
        for _ in 0..n {
            let len = u32_of(take(4)?) as usize;
            records.push(take(len)?.to_vec());
        }
        batches.push(Batch { seq, state, records });
    }
    (at == body.len()).then_some(batches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_what_they_hold_and_sort_in_order() {
        let snap = Shipped::Snapshot { gen: 2, seq: 10, state: 0xabc };
        let log = Shipped::Log { gen: 2, first: 11, last: 12, state: 7 };
        for o in [snap, log] {
            assert_eq!(Shipped::parse("s1", &o.key("s1")), Some(o));
            assert_eq!(Shipped::parse("s2", &o.key("s1")), None, "another scope's key");
        }
        assert!(snap.key("s1") < Shipped::Snapshot { gen: 3, seq: 1, state: 0 }.key("s1"));
        assert_eq!(Shipped::parse("s1", "scopes/s1/meta/g0000000000000002/x"), None);
        assert_eq!(Shipped::parse("s1", "scopes/s1/blocks/ab"), None);
    }

    #[test]
    fn a_log_object_reads_back_whole_or_not_at_all() {
        let batches = vec![
            Batch { seq: 4, state: 9, records: vec![b"one".to_vec(), Vec::new()] },
            Batch { seq: 5, state: 10, records: vec![vec![7u8; 300]] },
        ];
        let body = encode_log(&batches);
        assert_eq!(decode_log(&body), Some(batches));
        for cut in [0, 8, body.len() - 1] {
            assert_eq!(decode_log(&body[..cut]), None, "torn at {cut}");
        }
        let mut altered = body.clone();
        altered[20] ^= 1;
        assert_eq!(decode_log(&altered), None);
    }

    #[test]
    fn a_compressed_object_inflates_to_exactly_what_was_put() {
        let batches = vec![Batch { seq: 1, state: 2, records: vec![b"insert into dentries".repeat(500)] }];
        let raw = encode_log(&batches);
        let put = deflate(&raw);
        assert!(put.len() * 4 < raw.len(), "repetitive records shrink: {} of {}", put.len(), raw.len());
        assert_eq!(inflate(&put).as_deref(), Some(&raw[..]));
        assert_eq!(decode_log(&inflate(&put).unwrap()), Some(batches));
        // What daemons before compression put reads as it is.
        assert_eq!(inflate(&raw).as_deref(), Some(&raw[..]));
        let sqlite = b"SQLite format 3\0rest of a database";
        assert_eq!(inflate(sqlite).as_deref(), Some(&sqlite[..]));
        assert_eq!(deflate(b"").len(), 16 + 2, "an empty object is its header and an empty stream");
        assert_eq!(inflate(&deflate(b"")).as_deref(), Some(&b""[..]));
    }

    #[test]
    fn a_compressed_object_that_lies_about_its_length_or_is_torn_is_refused() {
        let raw = vec![7u8; 100_000];
        let put = deflate(&raw);
        for cut in [put.len() - 1, put.len() / 2, 20, 16, 12, 8] {
            assert_eq!(inflate(&put[..cut]), None, "torn at {cut}");
        }
        let with_len = |len: u64| {
            let mut p = put.clone();
            p[8..16].copy_from_slice(&len.to_le_bytes());
            p
        };
        assert_eq!(inflate(&with_len(99_999)), None, "inflates to more than it declares");
        assert_eq!(inflate(&with_len(100_001)), None, "inflates to less than it declares");
        assert_eq!(inflate(&with_len(MAX_INFLATED + 1)), None, "declares more than any object holds");
        assert_eq!(inflate(&with_len(100_000)).map(|b| b.len()), Some(100_000));
    }
}
