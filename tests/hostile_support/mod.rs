//! The hostile-tenant harness: a `scopefs serve` with small, known bounds and no sandbox executor,
//! a raw HTTP/1.1 client (so malformed request lines, bad UTF-8 and traversal bytes reach the
//! server unnormalized), a deterministic PRNG, latency statistics and daemon-health probes.

pub mod attacks;
pub mod bounds;
pub mod fuzz;
pub mod tools_flood;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use serde_json::{json, Value};

use crate::serve_process::{free_port, write_config, ServeProcess};

pub const SERVICE_TOKEN: &str = "hostile-test-service-token-0123456789";
pub const ADMIN_TOKEN: &str = "hostile-test-admin-token-0123456789";
/// The `/tools` HMAC secret of the test daemon.
pub const HMAC_SECRET: &str = "hostile-test-hmac-secret-0123456789abcdef";
/// `max_upload_bytes`: an 8 MiB PUT of zeros is 128 identical 64 KiB blocks (H1).
pub const MAX_UPLOAD: u64 = 8 * 1024 * 1024;
/// `block_size`: small, so identical blocks are cheap to produce.
pub const BLOCK: u64 = 64 * 1024;
/// `staging_max_bytes` (one budget for every scope): a leak of a few 8 MiB PUTs fills it.
pub const STAGING: u64 = 64 * 1024 * 1024;
/// `[limits] staging_max_bytes_per_scope`: one scope may never hold all of the global budget.
pub const STAGING_PER_SCOPE: u64 = 24 * 1024 * 1024;
/// `[limits] open_log_max_bytes_per_scope`: a file held open and rewritten passes it in a few
/// hundred writes (`bounds::open_log`).
pub const OPEN_LOG: u64 = 4 * 1024 * 1024;
/// `[limits] max_dir_handles_per_mount` (H3).
pub const DIR_HANDLES: u64 = 64;
/// `[limits] grep_max_regex_bytes`: `\w+` compiles smaller; `\w{10}` larger (but within the
/// default 1 MiB).
pub const GREP_REGEX: u64 = 64 * 1024;
/// `[limits] edit_max_diff_bytes`.
pub const EDIT_DIFF: u64 = 4096;
/// `[limits] max_links_per_file`.
pub const LINKS: u64 = 8;
/// `[limits] max_xattrs_per_inode`.
pub const XATTRS: u64 = 8;
/// `[limits] max_xattr_bytes_per_inode`.
pub const XATTR_BYTES: u64 = 1024;
/// `[limits] tools_body_memory_bytes`: room for seven of the 9 MiB bodies of
/// `bounds::tools_body_memory` at once, and for one of the 42 MiB reads (a 6 MiB file and its
/// 36 MiB answer) of `bounds::tools_answer_memory`.
pub const TOOLS_BODY_MEMORY: u64 = 64 * 1024 * 1024;
/// `[limits] tools_body_memory_per_user_bytes`: two of the 21 MiB answers of
/// `bounds::tools_answer_share` (three fill the budget), and one of the 42 MiB ones of
/// `bounds::tools_answer_memory`.
pub const TOOLS_BODY_MEMORY_PER_USER: u64 = 48 * 1024 * 1024;
/// The deployment's quota of every scope (`quota_bytes`, `quota_inodes`) for the fuzz and attacks.
pub const QUOTA: (u64, u64) = (512 * 1024 * 1024, 1_000_000);
/// The daemon's address-space cap: an unbounded allocation (H2, M1) aborts it quickly instead of
/// exhausting the shared CI machine. The fixed daemon stays far below it.
pub const ADDRESS_SPACE: u64 = 8 * 1024 * 1024 * 1024;

/// `[limits] http_max_connections` and `max_open_scope_databases`: lower than the defaults, so the
/// memory bound derived from the configuration is closer to what the attacks can reach.
pub const CONNECTIONS: u64 = 256;

/// `[limits] http_send_timeout_secs`: longer than `http_header_timeout_secs` (10 s, how long a
/// request waits for room in the body budget), so `bounds::tools_answer_memory` sees the requests
/// waiting behind an unread answer refused before that answer's connection is closed.
pub const SEND_TIMEOUT_SECS: u64 = 12;

/// Peak resident memory of the daemon over a whole attack. The fixed bounds keep it to a few
/// hundred MB (16 unauthenticated bodies, 64 directory snapshots, 10 MiB files); the review's
/// attacks each push it to several GB.
pub const PEAK_RSS: u64 = 1536 * 1024 * 1024;

/// A ready daemon with its service client; killed and its mounts detached on drop.
pub struct Hostile {
    pub serve: ServeProcess,
    pub dir: tempfile::TempDir,
    pub client: Client,
    pub addr: SocketAddr,
    /// The memory bound of its configuration, as `scopefs serve --print-config` states it: bytes
    /// without mounted scopes, and bytes per mounted scope.
    pub memory_bound: (u64, u64),
}

impl Hostile {
    pub fn start() -> Hostile {
        Hostile::with_quota(QUOTA)
    }

    /// A daemon whose scopes have a quota of `(bytes, inodes)`.
    pub fn with_quota((quota_bytes, quota_inodes): (u64, u64)) -> Hostile {
        let dir = tempfile::Builder::new().prefix("scopefs-hostile-").tempdir().unwrap();
        let port = free_port();
        let legacy = dir.path().join("legacy");
        std::fs::create_dir_all(legacy.join("docs")).unwrap();
        std::fs::write(legacy.join("docs/readme.txt"), b"legacy").unwrap();
        let sock = dir.path().join("no-docker.sock");
        let rest = format!(
            "deployment_id = \"hostile\"\nservice_token = {SERVICE_TOKEN:?}\nadmin_token = {ADMIN_TOKEN:?}\n\
             hmac_secret = {HMAC_SECRET:?}\nmax_upload_bytes = {MAX_UPLOAD}\nquota_bytes = {quota_bytes}\n\
             quota_inodes = {quota_inodes}\nblock_size = {BLOCK}\nstaging_max_bytes = {STAGING}\n\
             legacy_root = {legacy:?}\n\n[store]\nkind = \"local\"\n\n[executor]\ndocker_host = {sock:?}\n\n\
             [limits]\nstaging_max_bytes_per_scope = {STAGING_PER_SCOPE}\nmax_dir_handles_per_mount = {DIR_HANDLES}\n\
             grep_max_regex_bytes = {GREP_REGEX}\nedit_max_diff_bytes = {EDIT_DIFF}\nmax_links_per_file = {LINKS}\n\
             max_xattrs_per_inode = {XATTRS}\nmax_xattr_bytes_per_inode = {XATTR_BYTES}\n\
             tools_body_memory_bytes = {TOOLS_BODY_MEMORY}\ntools_body_memory_per_user_bytes = {TOOLS_BODY_MEMORY_PER_USER}\nhttp_max_connections = {CONNECTIONS}\n\
             max_open_scope_databases = {CONNECTIONS}\nhttp_send_timeout_secs = {SEND_TIMEOUT_SECS}\n\
             open_log_max_bytes_per_scope = {OPEN_LOG}\n",
        );
        let config = write_config(dir.path(), port, &rest);
        let memory_bound = printed_memory_bound(&config);
        let serve = ServeProcess::start(dir.path(), &config, port, "daemon.log", &[]);
        let client = Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
        let mut h = Hostile { serve, dir, client, addr: SocketAddr::from(([127, 0, 0, 1], port)), memory_bound };
        h.serve.wait_ready(&h.client);
        let pid = libc::pid_t::try_from(h.serve.pid()).unwrap();
        let cap = libc::rlimit { rlim_cur: ADDRESS_SPACE, rlim_max: ADDRESS_SPACE };
        // SAFETY: prlimit(2) on our own child with a valid rlimit; no old-limit pointer.
        assert_eq!(unsafe { libc::prlimit(pid, libc::RLIMIT_AS, &cap, std::ptr::null_mut()) }, 0);
        h
    }

    pub fn url(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.serve.base)
    }

    /// Provisions the draft scope of `thread`; returns its scope id.
    pub fn provision(&self, thread: &str) -> String {
        let r = self
            .client
            .post(self.url("/internal/workspace-scopes/provision"))
            .bearer_auth(SERVICE_TOKEN)
            .json(&json!({"operation_id": format!("op-{thread}"), "primary_thread_id": thread}))
            .send()
            .unwrap();
        assert!(r.status().is_success(), "provision {thread}: {}", r.status());
        r.json::<Value>().unwrap()["scope_id"].as_str().unwrap().to_string()
    }

    /// The host mountpoint of a scope (mounts it).
    pub fn mountpoint(&self, scope: &str) -> PathBuf {
        let r = self
            .client
            .get(self.url(&format!("/internal/workspace-scopes/{scope}/mount")))
            .bearer_auth(SERVICE_TOKEN)
            .send()
            .unwrap();
        assert!(r.status().is_success(), "mount {scope}: {}", r.status());
        PathBuf::from(r.json::<Value>().unwrap()["mountpoint"].as_str().unwrap())
    }

    /// `(method, path template, auth class)` of every route, from the daemon's own route table.
    pub fn routes(&self) -> Vec<fuzz::Route> {
        let doc: Value = self.client.get(self.url("/openapi.json")).send().unwrap().json().unwrap();
        let mut out = Vec::new();
        for (path, ops) in doc["paths"].as_object().expect("openapi paths") {
            for (method, op) in ops.as_object().unwrap() {
                let auth = op["x-scopefs-auth"].as_str().unwrap_or("public").to_string();
                out.push(fuzz::Route { method: method.to_ascii_uppercase(), path: path.clone(), auth });
            }
        }
        out.sort_by(|a, b| (&a.path, &a.method).cmp(&(&b.path, &b.method)));
        out
    }

    /// `None` when the process is running and `/health` answers 200, else why not.
    pub fn unhealthy(&self) -> Option<String> {
        if !process_alive(self.serve.pid()) {
            return Some(format!("the daemon process is gone; log tail:\n{}", tail(&self.serve.log_text(), 3000)));
        }
        match raw_request(self.addr, b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", &[], 10) {
            Outcome::Answer(r) if r.status == 200 => None,
            Outcome::Answer(r) => Some(format!("/health answered {}", r.status)),
            Outcome::NoAnswer { err, .. } => Some(format!("/health did not answer: {err}")),
        }
    }

    /// `GET /api/workspace/usage` of `thread`'s scope: `files`, `bytes`, `inodes`, `quota`.
    pub fn usage(&self, thread: &str) -> Value {
        let r = self.client.get(self.url("/api/workspace/usage")).query(&[("threadId", thread)]);
        let r = r.bearer_auth(SERVICE_TOKEN).send().unwrap();
        assert!(r.status().is_success(), "usage of {thread}: {}", r.status());
        r.json().unwrap()
    }

    /// Refusals so far because `bound` (a `scopefs::limits::Bound` label) was reached.
    pub fn refusals(&self, bound: &str) -> f64 {
        self.metric(&format!("scopefs_limit_refused_total{{bound=\"{bound}\"}}")).unwrap_or(-1.0)
    }

    /// Resets the daemon's peak resident set to its current one (`clear_refs` 5); returns it, in bytes.
    pub fn reset_peak_rss(&self) -> u64 {
        std::fs::write(format!("/proc/{}/clear_refs", self.serve.pid()), "5").expect("resetting VmHWM");
        proc_status_kib(self.serve.pid(), "VmRSS:") * 1024
    }

    /// Scopes of this daemon mounted now (FUSE mounts below its directory).
    pub fn mounted_scopes(&self) -> u64 {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("reading mountinfo");
        let dir = self.dir.path().to_string_lossy().into_owned();
        mounts.lines().filter(|l| l.contains(" fuse.scopefs ") && l.contains(&dir)).count() as u64
    }

    /// The daemon's peak resident set (VmHWM), in bytes.
    pub fn peak_rss(&self) -> u64 {
        proc_status_kib(self.serve.pid(), "VmHWM:") * 1024
    }

    /// A gauge or counter without labels from `/metrics` (sent with the service token: the route
    /// may be public or protected).
    pub fn metric(&self, name: &str) -> Option<f64> {
        let resp = self.client.get(self.url("/metrics")).bearer_auth(SERVICE_TOKEN).send().ok()?;
        let text = resp.error_for_status().ok()?.text().ok()?;
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }
}

/// `(bytes, bytes per mounted scope)` of the memory bound `scopefs serve --print-config` prints
/// for `config` (its line `# Memory bound: N MiB, plus K KiB per mounted scope ...`).
pub fn printed_memory_bound(config: &std::path::Path) -> (u64, u64) {
    let out = std::process::Command::new(crate::serve_process::BIN)
        .arg("--config")
        .arg(config)
        .args(["serve", "--print-config"])
        .output()
        .expect("running scopefs serve --print-config");
    assert!(out.status.success(), "--print-config failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text.lines().find_map(|l| l.strip_prefix("# Memory bound: ")).expect("a memory bound line");
    let (mib, rest) = line.split_once(" MiB, plus ").expect("the total in MiB");
    let kib = rest.split_once(" KiB").expect("the per-scope KiB").0;
    (mib.parse::<u64>().unwrap() << 20, kib.parse::<u64>().unwrap() << 10)
}

#[path = "../signing_support/mod.rs"]
pub mod signing_support;
pub use signing_support::{fresh_nonce, now_secs, signed_body_as, signed_body_with};

pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

fn proc_status_kib(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub fn tail(text: &str, n: usize) -> &str {
    let mut start = text.len().saturating_sub(n);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// xorshift64*: tiny, deterministic, good enough to pick shapes.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for request `index` of a run seeded with `seed` (independent of thread order).
    pub fn for_index(seed: u64, index: u64) -> Rng {
        let mut z = seed ^ index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True with probability `permille`/1000.
    pub fn chance(&mut self, permille: u64) -> bool {
        self.next_u64() % 1000 < permille
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// One answer of the raw client: the status and the `error.code` of a JSON error body.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub code: String,
}

#[derive(Debug, Clone)]
pub enum Outcome {
    Answer(Reply),
    /// No status line came back; `body_sent` says whether the whole request was written.
    NoAnswer {
        body_sent: bool,
        err: String,
    },
}

/// Sends `head` (request line and headers, ending with the blank line) then `body` over a new
/// connection to `addr` and reads the answer until the server closes (at most `timeout_secs`).
pub fn raw_request(addr: SocketAddr, head: &[u8], body: &[u8], timeout_secs: u64) -> Outcome {
    let timeout = Duration::from_secs(timeout_secs);
    let mut s = match TcpStream::connect_timeout(&addr, timeout) {
        Ok(s) => s,
        Err(e) => return Outcome::NoAnswer { body_sent: false, err: format!("connect: {e}") },
    };
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));
    let _ = s.set_nodelay(true);
    let sent = s.write_all(head).and_then(|_| s.write_all(body)).is_ok();
    let deadline = Instant::now() + timeout;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    // The status line and an error body arrive first; a big success body is not needed whole.
    while buf.len() < 256 * 1024 && Instant::now() < deadline {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if buf.is_empty() => return Outcome::NoAnswer { body_sent: sent, err: format!("read: {e}") },
            Err(_) => break,
        }
    }
    parse_reply(&buf)
        .map(Outcome::Answer)
        .unwrap_or_else(|| Outcome::NoAnswer { body_sent: sent, err: format!("no status line in {} bytes", buf.len()) })
}

fn parse_reply(buf: &[u8]) -> Option<Reply> {
    let line_end = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&buf[..line_end]).ok()?;
    let status: u16 = line.strip_prefix("HTTP/1.")?.get(2..5)?.parse().ok()?;
    let text = String::from_utf8_lossy(buf);
    let code =
        text.find("\"code\":\"").map(|i| text[i + 8..].chars().take_while(|c| *c != '"').collect()).unwrap_or_default();
    Some(Reply { status, code })
}

/// Per-operation latencies of the bystander.
#[derive(Debug, Default, Clone)]
pub struct Latencies(pub Vec<(&'static str, Duration)>);

impl Latencies {
    pub fn summary(&self) -> (Duration, Duration, Duration) {
        let mut all: Vec<Duration> = self.0.iter().map(|(_, d)| *d).collect();
        all.sort();
        if all.is_empty() {
            return (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        }
        let at = |q: f64| all[((all.len() - 1) as f64 * q).round() as usize];
        (at(0.5), at(0.99), *all.last().unwrap())
    }

    pub fn slowest(&self) -> Option<(&'static str, Duration)> {
        self.0.iter().max_by_key(|(_, d)| *d).copied()
    }
}
