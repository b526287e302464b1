//! A deployment of several `scopefs serve` nodes on this one machine (issue 23): each node in a
//! network namespace of its own with its own address on a bridge the lab makes (and removes when
//! dropped), one PostgreSQL registry (a schema of its own) and one Garage bucket (a prefix of its
//! own), both reached through forwarders the test runs on the bridge's address (they stay on
//! loopback). Nodes share the host's mount namespace, so the test reads their mounts directly.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_scopefs");
pub const SERVICE: &str = "nodes-test-service-token";
pub const ADMIN: &str = "nodes-test-admin-token";
pub const API_PORT: u16 = 7070;

pub fn env(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!("{name} is not set: this test needs PostgreSQL and Garage; run it through scripts/test.sh"),
    }
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The namespaces, the bridge and the veth pairs; removed on drop.
pub struct NetLab {
    tag: String,
    pub bridge_ip: Ipv4Addr,
    nodes: usize,
}

impl NetLab {
    /// A bridge with `10.<a>.<b>.1/24` and `nodes` namespaces at `.11`, `.12`, ...
    pub fn new(nodes: usize) -> NetLab {
        let r: u32 = rand::random();
        let tag = format!("{:06x}", r & 0xff_ffff);
        let (a, b) = (100 + (r >> 24) % 100, (r >> 16) & 0xff);
        let lab = NetLab { tag, bridge_ip: Ipv4Addr::new(10, a as u8, b as u8, 1), nodes };
        let br = lab.bridge();
        sh(&["ip", "link", "add", &br, "type", "bridge"]);
        // Traffic between the nodes crosses the host's firewall (bridged packets go through
        // iptables' FORWARD chain, whose policy Docker sets to DROP): let this bridge's own through.
        sh(&["iptables", "-I", "FORWARD", "-i", &br, "-o", &br, "-j", "ACCEPT"]);
        sh(&["ip", "addr", "add", &format!("{}/24", lab.bridge_ip), "dev", &br]);
        sh(&["ip", "link", "set", &br, "up"]);
        for i in 0..nodes {
            let (ns, host, peer) = (lab.netns(i), format!("sfh{}{i}", lab.tag), format!("sfp{}{i}", lab.tag));
            sh(&["ip", "netns", "add", &ns]);
            sh(&["ip", "link", "add", &host, "type", "veth", "peer", "name", &peer]);
            sh(&["ip", "link", "set", &host, "master", &br]);
            sh(&["ip", "link", "set", &host, "up"]);
            sh(&["ip", "link", "set", &peer, "netns", &ns]);
            sh(&["ip", "-n", &ns, "addr", "add", &format!("{}/24", lab.node_ip(i)), "dev", &peer]);
            sh(&["ip", "-n", &ns, "link", "set", &peer, "up"]);
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        }
        lab
    }

    fn bridge(&self) -> String {
        format!("sfb{}", self.tag)
    }

    pub fn netns(&self, i: usize) -> String {
        format!("sfn{}{i}", self.tag)
    }

    pub fn node_ip(&self, i: usize) -> Ipv4Addr {
        let o = self.bridge_ip.octets();
        Ipv4Addr::new(o[0], o[1], o[2], 11 + i as u8)
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        for i in 0..self.nodes {
            let _ = Command::new("ip").args(["netns", "del", &self.netns(i)]).status();
        }
        let br = self.bridge();
        let _ = Command::new("iptables").args(["-D", "FORWARD", "-i", &br, "-o", &br, "-j", "ACCEPT"]).status();
        let _ = Command::new("ip").args(["link", "del", &br]).status();
    }
}

/// Accepts on `listen` and relays each connection to `upstream` (both ways) until the process ends.
pub fn forward(listen: SocketAddr, upstream: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind(listen).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let Ok(up) = TcpStream::connect(upstream) else { continue };
            let (c2, u2) = (conn.try_clone().unwrap(), up.try_clone().unwrap());
            std::thread::spawn(move || relay(conn, up));
            std::thread::spawn(move || relay(u2, c2));
        }
    });
    addr
}

fn relay(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if std::io::Write::write_all(&mut to, &buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// The shared services as the nodes reach them: PostgreSQL and Garage through the bridge.
pub struct Shared {
    pub pg_url: String,
    pub schema: String,
    pub s3_endpoint: String,
    pub prefix: String,
}

impl Shared {
    pub fn new(lab: &NetLab) -> Shared {
        let pg: reqwest::Url = env("SCOPEFS_TEST_NODES_POSTGRES_URL").parse().unwrap();
        let pg_up = SocketAddr::new(pg.host_str().unwrap().parse().unwrap(), pg.port().unwrap());
        let pg_here = forward(SocketAddr::new(lab.bridge_ip.into(), 0), pg_up);
        let s3: reqwest::Url = env("SCOPEFS_TEST_S3_ENDPOINT").parse().unwrap();
        let s3_up = SocketAddr::new(s3.host_str().unwrap().parse().unwrap(), s3.port().unwrap());
        let s3_here = forward(SocketAddr::new(lab.bridge_ip.into(), 0), s3_up);
        let tag: u32 = rand::random();
        Shared {
            pg_url: format!("postgres://{}@{pg_here}{}", pg.username(), pg.path()),
            schema: format!("nodes_{tag:08x}"),
            s3_endpoint: format!("http://{s3_here}"),
            prefix: format!("nodes-{tag:08x}/"),
        }
    }

    /// The registry as the test reads it (through loopback).
    pub fn registry(&self) -> std::sync::Arc<scopefs::registry::Registry> {
        let url = env("SCOPEFS_TEST_NODES_POSTGRES_URL");
        let settings = scopefs::registry::PgSettings { url, pool_size: 2, schema: Some(self.schema.clone()) };
        std::sync::Arc::new(scopefs::registry::Registry::open_postgres(&settings).unwrap())
    }
}

/// One node: its directory, address and process (group).
pub struct Node {
    pub id: String,
    pub dir: PathBuf,
    pub ip: Ipv4Addr,
    child: Option<Child>,
}

impl Node {
    pub fn base(&self) -> String {
        format!("http://{}:{API_PORT}", self.ip)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn mount_root(&self) -> PathBuf {
        self.dir.join("mnt")
    }

    /// Starts node `i` of `lab` in its namespace (its own process group).
    pub fn start(lab: &NetLab, shared: &Shared, i: usize, root: &Path, lease_ms: u64, heartbeat_ms: u64) -> Node {
        let id = format!("node-{i}");
        let dir = root.join(&id);
        std::fs::create_dir_all(&dir).unwrap();
        let ip = lab.node_ip(i);
        let config = format!(
            "data_dir = {data:?}\nmount_root = {mnt:?}\nlisten = \"{ip}:{API_PORT}\"\nallow_remote = true\n\
             service_token = {SERVICE:?}\nadmin_token = {ADMIN:?}\nhmac_secret = \"nodes-test-hmac-secret\"\n\
             metadata_sync_interval_ms = 200\nfuse.attr_ttl_ms = 0\n\n\
             [registry]\nurl = {url:?}\nschema = {schema:?}\npool_size = 4\n\n\
             [node]\nid = {id:?}\napi_address = \"http://{ip}:{API_PORT}\"\nlease_ms = {lease_ms}\nheartbeat_ms = {heartbeat_ms}\n\n\
             [store]\nkind = \"s3\"\nendpoint = {e:?}\nregion = {r:?}\nbucket = {b:?}\nprefix = {prefix:?}\n\
             access_key_id = {k:?}\nsecret_access_key = {s:?}\n",
            data = dir.join("data"),
            mnt = dir.join("mnt"),
            url = shared.pg_url,
            schema = shared.schema,
            e = shared.s3_endpoint,
            r = env("SCOPEFS_TEST_S3_REGION"),
            b = env("SCOPEFS_TEST_S3_BUCKET"),
            prefix = shared.prefix,
            k = env("SCOPEFS_TEST_S3_ACCESS_KEY_ID"),
            s = env("SCOPEFS_TEST_S3_SECRET_ACCESS_KEY"),
        );
        let cfg = dir.join("scopefs.toml");
        std::fs::write(&cfg, config).unwrap();
        let netns = std::fs::File::open(format!("/run/netns/{}", lab.netns(i))).unwrap();
        let ns_fd = netns.as_raw_fd();
        let mut cmd = Command::new(BIN);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SCOPEFS_") {
                cmd.env_remove(k);
            }
        }
        cmd.env_remove("NOTIFY_SOCKET").env("SCOPEFS_LOG", "info,fuser=warn");
        // SAFETY: setns and setpgid are async-signal-safe; nothing is allocated in the child.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(ns_fd, libc::CLONE_NEWNET) != 0 || libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("daemon.log")).unwrap();
        let child = cmd
            .arg("--config")
            .arg(&cfg)
            .arg("serve")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting scopefs serve in its namespace");
        drop(netns);
        Node { id, dir, ip, child: Some(child) }
    }

    pub fn wait_ready(&mut self, http: &Client) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("{} exited ({status}) before it was ready:\n{}", self.id, self.log_tail());
            }
            if let Ok(r) = http.get(format!("{}/ready", self.base())).send() {
                if r.status().is_success() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "{} never became ready:\n{}", self.id, self.log_tail());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn pgid(&self) -> i32 {
        self.child.as_ref().expect("the node was killed").id() as i32
    }

    /// Sends `sig` to the node's whole process group (supervisor and worker).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) of a process group this test started.
        assert_eq!(unsafe { libc::kill(-self.pgid(), sig) }, 0, "signal {sig} to {}", self.id);
    }

    /// `kill -9` of the node (its whole group), reaped; its mounts detached.
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        detach_mounts_under(&self.dir);
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal(libc::SIGCONT);
            self.kill();
        }
    }
}

/// Mount points at or below `root` in this mount namespace (which the nodes share).
pub fn mounts_under(root: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let (root, below) = (root.to_string_lossy().to_string(), format!("{}/", root.to_string_lossy()));
    table
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|mp| *mp == root || mp.starts_with(&below))
        .collect()
}

pub fn detach_mounts_under(root: &Path) {
    for mp in mounts_under(root) {
        let _ = Command::new("umount").arg("-l").arg(&mp).status();
    }
}

/// `n` ready nodes of one deployment (lease 3 s, heartbeat 0.5 s). Dropped in field order: the
/// nodes are killed before their directory and the lab go.
pub struct Deployment {
    pub nodes: Vec<Node>,
    pub shared: Shared,
    pub root: tempfile::TempDir,
    pub lab: NetLab,
}

impl Deployment {
    pub fn start(n: usize, http: &Client) -> Deployment {
        let lab = NetLab::new(n);
        let shared = Shared::new(&lab);
        let root = tempfile::tempdir().unwrap();
        let mut nodes: Vec<Node> = (0..n).map(|i| Node::start(&lab, &shared, i, root.path(), 3_000, 500)).collect();
        for node in &mut nodes {
            node.wait_ready(http);
        }
        Deployment { nodes, shared, root, lab }
    }
}

pub fn http() -> Client {
    Client::builder().timeout(Duration::from_secs(60)).no_proxy().build().unwrap()
}

/// Provisions thread `thread`'s scope through `node` (placement picks its node); its id.
pub fn provision(http: &Client, node: &Node, thread: &str) -> String {
    let resp = http
        .post(format!("{}/internal/workspace-scopes/provision", node.base()))
        .bearer_auth(SERVICE)
        .json(&json!({"operation_id": format!("op-{thread}"), "primary_thread_id": thread, "user_id": "user-1"}))
        .send()
        .unwrap();
    let status = resp.status();
    let body: Value = resp.json().unwrap();
    body["scope_id"].as_str().unwrap_or_else(|| panic!("provision answered {status} {body}")).to_owned()
}

/// Asks `node` to mount `scope` (forwarded to the node serving it): (serving node, host view path),
/// or the status and body of the refusal.
pub fn mount(http: &Client, node: &Node, scope: &str) -> Result<(String, PathBuf), String> {
    let resp = http
        .get(format!("{}/internal/workspace-scopes/{scope}/mount", node.base()))
        .bearer_auth(SERVICE)
        .send()
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let body: Value = resp.json().map_err(|e| e.to_string())?;
    match (body["node_id"].as_str(), body["mountpoint"].as_str()) {
        (Some(n), Some(p)) if status.is_success() => Ok((n.to_string(), PathBuf::from(p))),
        _ => Err(format!("{status} {body}")),
    }
}
