//! A `scopefs serve` for the workspace API tests: temp config (local store, legacy root, small upload
//! limit and quota, production kernel-cache TTL), a blocking HTTP client with the service token, and
//! a check that no response names a physical path.

#[path = "../serve_process/mod.rs"]
pub mod serve_process;

use std::io::Read;
use std::ops::Deref;
use std::path::PathBuf;
use std::time::Duration;

use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::StatusCode;
use serde_json::{json, Value};
use serve_process::{free_port, write_config, ServeProcess};

pub const TOKEN: &str = "workspace-test-service-token-0123456789";
/// `max_upload_bytes` of the test daemon.
pub const MAX_UPLOAD: usize = 1024 * 1024;
/// `quota_bytes` of every test scope: two full-size uploads fit, a third does not.
pub const QUOTA: u64 = 2 * 1024 * 1024 + 512 * 1024;

/// One part of a multipart upload.
pub enum Part<'a> {
    File(&'a str, Vec<u8>),
    Text(&'a str, &'a str),
}

/// A response read whole.
pub struct Answer {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The error code of a `{"error":{"code"}}` body.
    pub fn code(&self) -> String {
        self.json()["error"]["code"].as_str().unwrap_or_default().to_string()
    }

    pub fn header(&self, name: &str) -> String {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
    }
}

/// A ready daemon in its own temp directory (the process: [`ServeProcess`], which it derefs to);
/// stopped with SIGTERM and its mounts detached on drop.
pub struct Daemon {
    serve: ServeProcess,
    /// After `serve`: the directory outlives the process.
    pub dir: tempfile::TempDir,
    pub client: Client,
    pub legacy: PathBuf,
}

impl Deref for Daemon {
    type Target = ServeProcess;

    fn deref(&self) -> &ServeProcess {
        &self.serve
    }
}

impl Daemon {
    pub fn start() -> Daemon {
        Self::start_with_env(&[])
    }

    pub fn start_with_env(env: &[(&str, &str)]) -> Daemon {
        let dir = tempfile::Builder::new().prefix("scopefs-ws-").tempdir().unwrap();
        let port = free_port();
        let legacy = dir.path().join("legacy");
        std::fs::create_dir_all(&legacy).unwrap();
        let rest = format!(
            "service_token = \"{TOKEN}\"\nmax_upload_bytes = {MAX_UPLOAD}\nquota_bytes = {QUOTA}\nlegacy_root = {legacy:?}\n\n\
             [store]\nkind = \"local\"\n"
        );
        let config = write_config(dir.path(), port, &rest);
        let serve = ServeProcess::start(dir.path(), &config, port, "daemon.log", env);
        let client = Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
        let mut d = Daemon { serve, dir, client, legacy };
        d.serve.wait_ready(&d.client);
        d
    }

    /// The host paths no answer may contain.
    pub fn physical_paths(&self) -> Vec<String> {
        let root = self.dir.path().to_string_lossy().into_owned();
        vec![root.clone(), format!("{root}/data"), format!("{root}/mnt"), self.legacy.to_string_lossy().into_owned()]
    }

    pub fn url(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.base)
    }

    /// Sends with the service token and reads the answer; fails if it names a physical path.
    pub fn send(&self, req: RequestBuilder) -> Answer {
        let resp: Response = req.bearer_auth(TOKEN).send().expect("request failed");
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.bytes().expect("reading the body").to_vec();
        let answer = Answer { status, headers, body };
        let seen = format!("{:?}\n{}", answer.headers, answer.text());
        for p in self.physical_paths() {
            assert!(!seen.contains(&p), "an answer contains the physical path {p}: {seen}");
        }
        answer
    }

    pub fn get(&self, path_and_query: &str) -> Answer {
        self.send(self.client.get(self.url(path_and_query)))
    }

    /// Provisions the scope of `thread` (draft); returns its scope id.
    pub fn provision(&self, thread: &str) -> String {
        let a = self.send(
            self.client
                .post(self.url("/internal/workspace-scopes/provision"))
                .json(&json!({"operation_id": format!("op-{thread}"), "primary_thread_id": thread})),
        );
        assert!(a.status.is_success(), "provision {thread}: {} {}", a.status, a.text());
        let v = a.json();
        assert_eq!(v["state"], "draft", "{v}");
        v["scope_id"].as_str().unwrap().to_string()
    }

    /// The host mountpoint of a scope (the one route that returns a host path: not checked).
    pub fn mountpoint(&self, scope: &str) -> PathBuf {
        let r = self
            .client
            .get(self.url(&format!("/internal/workspace-scopes/{scope}/mount")))
            .bearer_auth(TOKEN)
            .send()
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let v: Value = r.json().unwrap();
        PathBuf::from(v["mountpoint"].as_str().unwrap())
    }

    /// Uploads one file through multipart; `query` is appended to `?threadId=<thread>`.
    pub fn upload(&self, thread: &str, name: &str, content: Vec<u8>, query: &str) -> Answer {
        self.upload_parts(thread, &[Part::File(name, content)], query)
    }

    /// Sends a multipart upload built by hand (the filename goes on the wire exactly as given).
    pub fn upload_parts(&self, thread: &str, parts: &[Part<'_>], query: &str) -> Answer {
        const BOUNDARY: &str = "scopefs-test-boundary-7f3a";
        let mut body = Vec::new();
        for part in parts {
            body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
            match part {
                Part::File(name, content) => {
                    body.extend_from_slice(b"Content-Disposition: form-data; name=\"file\"; filename=\"");
                    body.extend_from_slice(name.as_bytes());
                    body.extend_from_slice(b"\"\r\nContent-Type: application/octet-stream\r\n\r\n");
                    body.extend_from_slice(content);
                }
                Part::Text(field, value) => {
                    body.extend_from_slice(
                        format!("Content-Disposition: form-data; name=\"{field}\"\r\n\r\n").as_bytes(),
                    );
                    body.extend_from_slice(value.as_bytes());
                }
            }
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
        self.send(
            self.client
                .post(self.url(&format!("/api/workspace/upload?threadId={thread}{query}")))
                .header("content-type", format!("multipart/form-data; boundary={BOUNDARY}"))
                .body(body),
        )
    }

    /// Reads a file through the API.
    pub fn read(&self, thread: &str, path: &str) -> Answer {
        self.send(self.client.get(self.url("/api/workspace/file")).query(&[("threadId", thread), ("path", path)]))
    }

    pub fn put(&self, thread: &str, path: &str, content: Vec<u8>) -> Answer {
        self.send(
            self.client
                .put(self.url("/api/workspace/file"))
                .query(&[("threadId", thread), ("path", path)])
                .body(content),
        )
    }

    /// Recursive listing as sorted `(path, type, size)` rows.
    pub fn listing(&self, thread: &str) -> Vec<(String, String, u64)> {
        let a = self.send(self.client.get(self.url("/api/workspace")).query(&[
            ("threadId", thread),
            ("path", ""),
            ("recursive", "1"),
        ]));
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        let mut rows: Vec<(String, String, u64)> = a.json()["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["path"].as_str().unwrap().to_string(),
                    e["type"].as_str().unwrap().to_string(),
                    e["size"].as_u64().unwrap(),
                )
            })
            .collect();
        rows.sort();
        rows
    }

    pub fn usage(&self, thread: &str) -> Value {
        let a = self.send(self.client.get(self.url("/api/workspace/usage")).query(&[("threadId", thread)]));
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        a.json()
    }

    /// The entries of the workspace zip: name → content (directories end with `/`, content empty).
    pub fn zip_entries(&self, thread: &str) -> Vec<(String, Vec<u8>)> {
        let a = self.send(self.client.get(self.url("/api/workspace/download")).query(&[("threadId", thread)]));
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        assert_eq!(a.header("content-type"), "application/zip");
        assert!(a.header("content-disposition").starts_with("attachment;"), "{}", a.header("content-disposition"));
        let mut archive = zip::ZipArchive::new(std::io::Cursor::new(a.body)).expect("a valid zip");
        let mut out = Vec::new();
        for i in 0..archive.len() {
            let mut f = archive.by_index(i).unwrap();
            let mut content = Vec::new();
            f.read_to_end(&mut content).unwrap();
            out.push((f.name().unwrap().to_string(), content));
        }
        out.sort();
        out
    }

    /// SIGTERM, up to 30 s for the exit, then SIGKILL; detaches any mount left. Never panics.
    pub fn stop(&mut self) {
        self.serve.stop(Duration::from_secs(30));
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}
