//! `MemoryStore`: an in-memory object store for tests that can inject failures, stalls and corruption.
pub struct MemoryStore;
