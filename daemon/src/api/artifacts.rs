//! One artifact as the API answers it, in `destroy_environment` and in `/admin/pending-usage`'s
//! manifest (seed 003 `ArtifactObject` where it maps): its paths, an `artifact_id` and the
//! `object_key` that names it in seed 003's storage layout (`object_scope` entries of that shape
//! grant it: `api/tools/object_scope.rs`). An output of the user's global store (artifact path
//! `/__global__/…`: `services::compute::outputs`) is keyed `users/{user_id}/files/…`. Its bytes
//! are kept as hashed in a snapshot of its store taken as the environment ended (`snapshot_id`).

use scopefs::registry::billing::ArtifactEntry;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::services::compute::WORKSPACE;
use crate::services::peers::GLOBAL_ROOT;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct ArtifactView {
    /// The same for the same file of the same environment, whoever asks and however often.
    pub artifact_id: String,
    /// `threads/{thread_id}/files/{logical_path}` (`users/{user_id}/files/…` in the global store):
    /// the artifact stays in its scope; this key names it as seed 003's layout does (a signed
    /// `object_scope` entry of it grants reading it).
    pub object_key: String,
    /// `/workspace/...` or `/__global__/...`: can be sent back to the file tools as a `path`.
    pub path: String,
    /// The same path relative to `/workspace` or `/__global__` (seed §3.3 `logical_path`).
    pub logical_path: String,
    pub size_bytes: u64,
    pub sha256: String,
    pub content_type: String,
    /// The snapshot that keeps the bytes as hashed, whatever happens to the file after: of the
    /// thread's scope, read with `/api/workspace/file?threadId=…&path=/{logical_path}&snapshotId=…`
    /// (`out.{environment_id}`), or of the user's global store (`out.{environment_id}.g`). Absent
    /// for artifacts recorded before artifacts were kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
}

impl ArtifactView {
    /// The view of `e`, an output of environment `environment_id` of thread `thread_id` of user
    /// `user_id`.
    pub fn of(e: ArtifactEntry, environment_id: &str, thread_id: &str, user_id: &str) -> ArtifactView {
        let digest = Sha256::new().chain_update(environment_id).chain_update([0u8]).chain_update(&e.path).finalize();
        let global = e.path.strip_prefix(GLOBAL_ROOT).and_then(|r| r.strip_prefix('/')).map(str::to_string);
        let (object_key, path, logical_path) = match global {
            Some(rel) => (format!("users/{user_id}/files/{rel}"), e.path, rel),
            None => (format!("threads/{thread_id}/files/{}", e.path), format!("{WORKSPACE}/{}", e.path), e.path),
        };
        ArtifactView {
            artifact_id: format!("art_{}", &hex::encode(digest)[..32]),
            object_key,
            path,
            logical_path,
            size_bytes: e.size_bytes,
            sha256: e.sha256,
            content_type: e.content_type,
            snapshot_id: e.snapshot_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_per_environment_and_path() {
        let e = |p: &str| ArtifactEntry {
            path: p.into(),
            size_bytes: 1,
            sha256: "a".repeat(64),
            content_type: "text/plain".into(),
            snapshot_id: None,
        };
        let a = ArtifactView::of(e("out/a.txt"), "env_1", "thr_1", "u1");
        assert_eq!(a, ArtifactView::of(e("out/a.txt"), "env_1", "thr_1", "u1"));
        assert_ne!(a.artifact_id, ArtifactView::of(e("out/a.txt"), "env_2", "thr_1", "u1").artifact_id);
        assert_ne!(a.artifact_id, ArtifactView::of(e("out/b.txt"), "env_1", "thr_1", "u1").artifact_id);
        assert_eq!((a.object_key.as_str(), a.path.as_str()), ("threads/thr_1/files/out/a.txt", "/workspace/out/a.txt"));
        assert!(a.artifact_id.starts_with("art_") && a.artifact_id.len() == 36);
        let g = ArtifactView::of(e("/__global__/lib/x.py"), "env_1", "thr_1", "u1");
        assert_eq!(
            (g.object_key.as_str(), g.path.as_str(), g.logical_path.as_str()),
            ("users/u1/files/lib/x.py", "/__global__/lib/x.py", "lib/x.py")
        );
    }
}
