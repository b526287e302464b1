//! What a scope's metadata objects in the bucket are (`ship.rs` puts them, `restore.rs` reads
//! them): their keys, which name what each holds, and the bytes of a log object.

/// First bytes of a log object.
const LOG_MAGIC: [u8; 8] = *b"SFSHIP\x01\x00";

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
}
