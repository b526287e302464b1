//! `read_file` and `download_file`: whole-file answers, charged to the `/tools` body budget
//! (`[limits] tools_body_memory_bytes`) from before the file is read until the answer has been
//! sent. A client that reads its answer slowly (or not at all) therefore holds budget, not
//! unbounded memory: at most one answer per HTTP connection used to stay in memory, up to about
//! six times the file limit each (a text of control characters escapes six bytes a byte).
//! No room within `http_header_timeout_secs` is 503 `busy`, as for request bodies.

use axum::extract::State;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::super::held_answer::HeldAnswer;
use super::super::{blocking_as, ApiError, AppState};
use super::auth::SignedRequest;
use super::body_memory::{charged_json, json_string_len};
use super::engine_err;
use super::files::{check_environment, read_whole, sha256_hex, text};
use super::object_scope::check_read;
use super::target::{target, Target};
use crate::pools::RouteClass::Tools;

/// Bytes of an answer besides its content (the path and the other fields, as JSON).
const FIELDS: u64 = 512;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PathParams {
    #[serde(default)]
    environment_id: Option<String>,
    path: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(super) struct ReadView {
    path: String,
    content: String,
    size_bytes: usize,
}

/// The file `path` names, once the request's environment and grant allow reading it, and its size
/// (at most the file limit: what reading it may bring into memory).
fn readable<T>(
    st: &AppState,
    req: &SignedRequest<T>,
    env_id: Option<&str>,
    path: &str,
) -> Result<(Target, u64), ApiError> {
    check_environment(st, req, env_id)?;
    let t = target(st, req, path, false)?;
    check_read(req.grant.as_ref(), &t.path())?;
    let size = t.engine.resolve_path(&t.rel).map_err(engine_err)?.size.min(st.tools.file_limit);
    Ok((t, size))
}

pub(super) async fn read_file(
    State(st): State<AppState>,
    req: SignedRequest<PathParams>,
) -> Result<HeldAnswer, ApiError> {
    let limit = st.tools.file_limit;
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        let (t, size) = readable(&st, &req, req.body.environment_id.as_deref(), &req.body.path)?;
        // The content first; its answer's exact length is known once it is read. Without room for
        // that now, the content's charge is given back and the whole is waited for at once (no
        // request waits for answer room while holding a content charge), then the file is read
        // again.
        let mut charge = st.tools.charge_blocking(&req.user_id, size)?;
        let mut content = text(read_whole(&t.engine, &t.rel, limit)?)?;
        let answer = json_string_len(&content) + FIELDS;
        if !charge.try_grow(answer) {
            drop((content, charge));
            charge = st.tools.charge_blocking(&req.user_id, size + answer)?;
            content = text(read_whole(&t.engine, &t.rel, limit)?)?;
        }
        let view = ReadView { path: t.path(), size_bytes: content.len(), content };
        charged_json(&view, charge)
    })
    .await
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DownloadParams {
    #[serde(default)]
    environment_id: Option<String>,
    remote_path: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(super) struct DownloadView {
    path: String,
    content_base64: String,
    sha256: String,
    size_bytes: usize,
}

pub(super) async fn download_file(
    State(st): State<AppState>,
    req: SignedRequest<DownloadParams>,
) -> Result<HeldAnswer, ApiError> {
    let limit = st.tools.file_limit;
    blocking_as(Tools, req.share(), move || -> Result<_, ApiError> {
        let (t, size) = readable(&st, &req, req.body.environment_id.as_deref(), &req.body.remote_path)?;
        // The content, its base64 and the answer that holds it.
        let charge = st.tools.charge_blocking(&req.user_id, size + 2 * (size.div_ceil(3) * 4) + FIELDS)?;
        let data = read_whole(&t.engine, &t.rel, limit)?;
        let view = DownloadView {
            path: t.path(),
            content_base64: BASE64.encode(&data),
            sha256: sha256_hex(&data),
            size_bytes: data.len(),
        };
        drop(data);
        charged_json(&view, charge)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn download_answers_keep_their_shape() {
        let data = b"bytes\xff";
        let download = DownloadView {
            path: "/workspace/f.bin".into(),
            content_base64: BASE64.encode(data),
            sha256: sha256_hex(data),
            size_bytes: data.len(),
        };
        let former = serde_json::json!({
            "path": "/workspace/f.bin",
            "content_base64": "Ynl0ZXP/",
            "sha256": sha256_hex(data),
            "size_bytes": 6,
        });
        assert_eq!(serde_json::to_value(download).unwrap(), former);
    }

    #[test]
    fn json_string_lengths_match_serde_json() {
        for s in ["", "plain text", "quote \" and \\ and \n\r\t\u{8}\u{c}", "\u{1}\u{1f}\u{7f}", "é ü 中 😀"] {
            assert_eq!(json_string_len(s), serde_json::to_string(s).unwrap().len() as u64, "{s:?}");
        }
    }
}
