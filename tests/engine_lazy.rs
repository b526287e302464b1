//! Idle scopes cost nothing per scope (issue 10): a scope's metadata database is opened on first
//! use, unless the scope has an upload journal to replay, which is recovered at once. One test in
//! its own binary, because the count of open databases is process-wide.

pub mod engine_support;

use std::time::Duration;

use engine_support::*;
use scopefs::engine::*;
use scopefs::ids::ScopeId;

#[test]
fn idle_scopes_open_no_database_until_used_and_journals_replay_at_once() {
    let h = Harness::small_blocks();
    let ids: Vec<ScopeId> = (0..20).map(|_| ScopeId::generate()).collect();
    {
        let storage = h.storage();
        for id in &ids {
            let e = storage.open_scope(id, big_quota()).unwrap();
            write_file(&e, "f", b"committed and uploaded").unwrap();
            assert!(e.wait_uploads(Duration::from_secs(10)));
        }
    }
    // The last reference may be a scope's uploader finishing its pass on the runtime.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while open_databases() != 0 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(open_databases(), 0, "every engine was dropped");
    // A restart: twenty mounted, idle scopes hold no database.
    let storage = h.storage();
    let engines: Vec<_> = ids.iter().map(|id| storage.open_scope(id, big_quota()).unwrap()).collect();
    assert_eq!(open_databases(), 0);
    assert_eq!(read_file(&engines[5], "f").unwrap(), b"committed and uploaded");
    assert_eq!(open_databases(), 1, "first use opened one");

    // A scope with a journaled block (its upload cannot finish) is recovered when it is opened.
    h.store.set_unavailable(true);
    let pending = ScopeId::generate();
    {
        // A daemon on its own runtime, killed with its uploads retrying: its tasks (and with them
        // the engine that owns the database) go, the journal stays.
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let store: std::sync::Arc<dyn scopefs::store::ObjectStore> = h.store.clone();
        let killed = Storage::new(store, h.settings.clone(), &h.data_dir(), rt.handle().clone()).unwrap();
        let stuck = killed.open_scope(&pending, big_quota()).unwrap();
        write_file(&stuck, "pending", b"journaled, not uploaded").unwrap();
        drop((stuck, killed));
        // Waits until its worker threads have stopped and dropped every task.
        drop(rt);
    }
    let before = open_databases();
    let restarted = h.storage().open_scope(&pending, big_quota()).unwrap();
    assert_eq!(open_databases(), before + 1, "the scope with a journal to replay opened its database");
    h.store.set_unavailable(false);
    assert!(restarted.wait_uploads(Duration::from_secs(10)), "the journal was replayed");
    assert_eq!(read_file(&restarted, "pending").unwrap(), b"journaled, not uploaded");
    drop((engines, restarted));
}
