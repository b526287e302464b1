//! FUSE adapter over the scopefs file engine, and the per-scope mount manager.
