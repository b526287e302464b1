//! Requests a restarted server may be handed again, and what they were answered. A caller (the FUSE
//! adapter) runs each request inside `ScopeEngine::begin_request`; every mutation it makes is
//! recorded in the redo log with the request's id and its answer (an inode number, or 0), in the
//! same record as the mutation itself. When a server dies after a mutation is logged but before the
//! request is answered, the kernel hands the request to the next server marked as resent; the
//! engine then answers it as it was answered (`ScopeEngine::resent_answer`) instead of running it
//! again (a `mkdir` would answer `EEXIST`, an `unlink` `ENOENT`, an exchange would swap back).
//!
//! The answers a dead process left are kept for its successor: those of the batch not yet committed
//! are in the log's records; at each batch commit the answers of requests not yet answered go into
//! `redo_state.answered` with the commit. A successor keeps what it inherited until it has committed
//! `KEEP_COMMITS` batches and `KEEP_FOR` has passed (resent requests are served first, ahead of new
//! ones), and never more than `MAX_INHERITED` (the newest).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Inherited answers kept at most (the newest requests).
const MAX_INHERITED: usize = 1024;
/// Batch commits after which inherited answers are dropped (with `KEEP_FOR`).
const KEEP_COMMITS: u32 = 8;
/// Time after which inherited answers are dropped (with `KEEP_COMMITS`).
const KEEP_FOR: Duration = Duration::from_secs(60);

#[derive(Clone, Copy)]
struct Current {
    id: u64,
    resent: bool,
}

thread_local! {
    static CURRENT: Cell<Option<Current>> = const { Cell::new(None) };
}

/// The request the calling thread runs, if any: its id (for the redo record).
pub(crate) fn current_id() -> u64 {
    CURRENT.with(|c| c.get().map_or(0, |c| c.id))
}

/// The id of the calling thread's request when it is a resent one.
fn current_resent() -> Option<u64> {
    CURRENT.with(|c| c.get().filter(|c| c.resent).map(|c| c.id))
}

/// Answers of requests, shared by a scope's engine and its metadata database.
#[derive(Default)]
pub(crate) struct Answers {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// This process's requests that mutated and are not answered yet: id → answer.
    unanswered: HashMap<u64, u64>,
    /// Answers an earlier process left: id → answer.
    inherited: BTreeMap<u64, u64>,
    inherited_at: Option<Instant>,
    commits_since: u32,
}

impl Answers {
    /// A mutation of request `id` was logged with `answer` (0: none).
    pub fn logged(&self, id: u64, answer: u64) {
        if id == 0 {
            return;
        }
        let mut inner = self.inner.lock();
        let slot = inner.unanswered.entry(id).or_insert(0);
        *slot = (*slot).max(answer);
    }

    /// Request `id` was answered: nobody will hand it again.
    pub fn answered(&self, id: u64) {
        let mut inner = self.inner.lock();
        inner.unanswered.remove(&id);
        inner.inherited.remove(&id);
    }

    /// The answer recorded for request `id`, if a mutation of it was logged.
    pub fn lookup(&self, id: u64) -> Option<u64> {
        let inner = self.inner.lock();
        inner.inherited.get(&id).or_else(|| inner.unanswered.get(&id)).copied()
    }

    /// Answers found when the database was opened (its `redo_state.answered` and replayed records).
    pub fn inherit(&self, found: impl IntoIterator<Item = (u64, u64)>) {
        let mut inner = self.inner.lock();
        let mut any = false;
        for (id, answer) in found {
            if id != 0 {
                let slot = inner.inherited.entry(id).or_insert(0);
                *slot = (*slot).max(answer);
                any = true;
            }
        }
        while inner.inherited.len() > MAX_INHERITED {
            inner.inherited.pop_first();
        }
        if any {
            inner.inherited_at = Some(Instant::now());
            inner.commits_since = 0;
        }
    }

    /// What a batch commit keeps for a successor, encoded (`decode` reads it back); drops inherited
    /// answers that are old enough.
    pub fn for_commit(&self) -> Vec<u8> {
        let mut inner = self.inner.lock();
        inner.commits_since = inner.commits_since.saturating_add(1);
        let expired = inner.commits_since >= KEEP_COMMITS && inner.inherited_at.is_none_or(|t| t.elapsed() >= KEEP_FOR);
        if expired && !inner.inherited.is_empty() {
            inner.inherited.clear();
        }
        let mut out = Vec::with_capacity(16 * (inner.unanswered.len() + inner.inherited.len()));
        for (id, answer) in inner.inherited.iter().chain(inner.unanswered.iter()) {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&answer.to_le_bytes());
        }
        out
    }
}

/// Reads what `Answers::for_commit` wrote.
pub(crate) fn decode(blob: &[u8]) -> Vec<(u64, u64)> {
    blob.chunks_exact(16)
        .map(|c| {
            let id = u64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
            let answer = u64::from_le_bytes(c[8..].try_into().expect("8 bytes"));
            (id, answer)
        })
        .collect()
}

/// One request running on the calling thread (see `ScopeEngine::begin_request`); when dropped (after
/// the request was answered) its answers are no longer kept.
pub struct RequestScope<'a> {
    answers: &'a Answers,
    id: u64,
    previous: Option<Current>,
}

impl<'a> RequestScope<'a> {
    pub(crate) fn enter(answers: &'a Answers, id: u64, resent: bool) -> RequestScope<'a> {
        let previous = CURRENT.with(|c| c.replace(Some(Current { id, resent })));
        RequestScope { answers, id, previous }
    }
}

impl Drop for RequestScope<'_> {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
        if self.id != 0 {
            self.answers.answered(self.id);
        }
    }
}

impl Answers {
    /// The recorded answer of the calling thread's request, when it is resent and was logged.
    pub fn resent_answer(&self) -> Option<u64> {
        current_resent().and_then(|id| self.lookup(id))
    }
}

/// The kernel's view of a scope across processes: its probe of held inodes, its forgets, and its
/// requests that a later process may be handed again.
impl crate::engine::ScopeEngine {
    /// Installs (or removes) the mount's probe of whether the kernel still holds an inode.
    pub fn set_kernel_probe(&self, probe: Option<crate::engine::KernelProbe>) {
        *self.kernel_probe.lock() = probe;
    }

    /// The kernel let go of inode `ino` (FUSE `FORGET`). On a resumed mount an inode without a name
    /// that no handle of this process holds is deleted now: it was kept for the kernel.
    pub fn forget(&self, ino: crate::engine::Ino) {
        if !self.kernel_unknown.load(std::sync::atomic::Ordering::Acquire)
            || ino == crate::engine::ROOT_INO
            || self.open_files.lock().contains_key(&ino)
        {
            return;
        }
        self.delete_unlinked(ino);
    }

    /// Starts one request that the kernel may hand a later process again (see `requests.rs`): its
    /// mutations are recorded with `id`, and when `resent` is set a request already applied is
    /// answered as it was. Keep the scope until the request is answered.
    pub fn begin_request(&self, id: u64, resent: bool) -> RequestScope<'_> {
        RequestScope::enter(&self.answers, id, resent)
    }

    /// The answer recorded for the calling thread's request when it is resent and was applied.
    pub(crate) fn resent_answer(&self) -> Option<u64> {
        self.answers.resent_answer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_request_is_answered_again_only_when_resent() {
        let a = Answers::default();
        {
            let _r = RequestScope::enter(&a, 10, false);
            assert_eq!(current_id(), 10);
            a.logged(current_id(), 77);
            assert_eq!(a.resent_answer(), None, "a first delivery runs");
        }
        assert_eq!(current_id(), 0);
        assert_eq!(a.lookup(10), None, "answered: forgotten");
        // A successor inherits what a dead process logged and answers its resends from it.
        let b = Answers::default();
        b.inherit(decode(&{
            a.logged(11, 5);
            a.for_commit()
        }));
        let _r = RequestScope::enter(&b, 11, true);
        assert_eq!(b.resent_answer(), Some(5));
    }

    #[test]
    fn inherited_answers_are_bounded_and_expire_after_commits_and_time() {
        let a = Answers::default();
        a.inherit((1..=(MAX_INHERITED as u64 + 10)).map(|i| (i, i)));
        assert_eq!(a.lookup(1), None, "the oldest beyond the bound are dropped");
        assert_eq!(a.lookup(MAX_INHERITED as u64 + 10), Some(MAX_INHERITED as u64 + 10));
        for _ in 0..KEEP_COMMITS + 2 {
            a.for_commit();
        }
        assert!(a.lookup(MAX_INHERITED as u64 + 10).is_some(), "kept while younger than KEEP_FOR");
        a.inner.lock().inherited_at = Instant::now().checked_sub(KEEP_FOR);
        let blob = a.for_commit();
        assert!(blob.is_empty() && a.lookup(MAX_INHERITED as u64 + 10).is_none());
    }
}
