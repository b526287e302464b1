//! `LocalDirStore`: objects as files under a local directory (the embedded default backend).
pub struct LocalDirStore;
