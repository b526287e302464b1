//! Errors that may have lost data of open files, reported to each handle once (as Linux reports
//! write-back errors through `errseq_t`): a failed durability point of the scope (its flushes can no
//! longer be believed), a block found damaged, changes of an open file that could not be put back
//! after a restart. Each handle remembers what it has seen; `flush` and `fsync` of a handle that has
//! not seen an error yet fail once with it. A handle opened after an error that nobody has been told
//! yet is told too; one opened after it was reported is not (it could not have written the lost
//! data), but a scope whose durability failed keeps failing every durability point anyway.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::types::Ino;

/// What a handle has seen: the scope's and its inode's error counters at that time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    scope: u64,
    inode: u64,
}

#[derive(Default)]
struct Counter {
    /// Errors so far.
    seq: u64,
    /// The highest `seq` reported to any handle.
    reported: u64,
}

/// The error counters of one scope.
#[derive(Default)]
pub(crate) struct ErrSeq {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    scope: Counter,
    inodes: HashMap<Ino, Counter>,
}

impl Counter {
    /// What a new handle starts from: an error nobody was told of is still news.
    fn start(&self) -> u64 {
        if self.reported < self.seq {
            self.reported
        } else {
            self.seq
        }
    }
}

impl ErrSeq {
    /// An error that may have lost data of any open file of the scope.
    pub fn scope_error(&self) {
        self.inner.lock().scope.seq += 1;
    }

    /// An error that may have lost data of inode `ino`.
    pub fn inode_error(&self, ino: Ino) {
        self.inner.lock().inodes.entry(ino).or_default().seq += 1;
    }

    /// Where a handle opened now on `ino` starts.
    pub fn sample(&self, ino: Ino) -> Seen {
        let inner = self.inner.lock();
        Seen { scope: inner.scope.start(), inode: inner.inodes.get(&ino).map_or(0, Counter::start) }
    }

    /// Whether a handle on `ino` that has seen `seen` must be told of an error now (once: `seen`
    /// moves on).
    pub fn check(&self, ino: Ino, seen: &mut Seen) -> bool {
        let mut inner = self.inner.lock();
        let mut news = false;
        if inner.scope.seq > seen.scope {
            seen.scope = inner.scope.seq;
            inner.scope.reported = inner.scope.seq;
            news = true;
        }
        if let Some(c) = inner.inodes.get_mut(&ino) {
            if c.seq > seen.inode {
                seen.inode = c.seq;
                c.reported = c.seq;
                news = true;
            }
        }
        news
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_handle_is_told_once_and_later_handles_only_of_news() {
        let e = ErrSeq::default();
        let (mut a, mut b) = (e.sample(1), e.sample(2));
        assert!(!e.check(1, &mut a));
        e.inode_error(1);
        let mut opened_after_unreported = e.sample(1);
        assert!(e.check(1, &mut a), "told");
        assert!(!e.check(1, &mut a), "once");
        assert!(!e.check(2, &mut b), "another inode's error is not this handle's");
        assert!(e.check(1, &mut opened_after_unreported), "nobody had been told when it opened");
        let mut opened_after_reported = e.sample(1);
        assert!(!e.check(1, &mut opened_after_reported));
        e.scope_error();
        assert!(e.check(2, &mut b) && e.check(1, &mut a), "a scope error reaches every handle");
        let mut adopted = Seen::default();
        assert!(e.check(1, &mut adopted), "a handle of an earlier process has seen nothing");
    }
}
