//! Issue 25, acceptance d: the admin page (`/admin/ui`) in headless Chromium, driven over the
//! DevTools protocol (CDP) against a real daemon with the Docker executor.
//!
//! The browser logs in through the form (the token typed into the field, Enter pressed), sees the
//! scope this test created, an environment appear on the environments page (with its process and
//! cost so far) and end once destroyed, the settled usage with its artifact and the ledger row of
//! its settlement, the health and refusal pages; the session cookie is HttpOnly and
//! SameSite=Strict; a page without the cookie redirects to the login form; a POST without the CSRF
//! token (and a cross-site login post) is refused. Screenshots go to
//! `<target>/test-output/admin_ui/NN-name.png`.
//!
//! Needs root, /dev/fuse, a Docker engine with `SCOPEFS_TEST_DOCKER_IMAGE` (scripts/docker.sh) and
//! Debian's `chromium` (scripts/install-deps.sh); without them it fails.

pub mod compute_support;
pub mod serve_process;

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use compute_support::daemon::remove_containers;
use compute_support::{admin_call, compute_toml, docker_image, provision, signed_call, uid, Secrets};
use reqwest::blocking::Client;
use reqwest::StatusCode;
use serde_json::{json, Value};
use serve_process::{free_port, write_config, ServeProcess};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

const SERVICE_TOKEN: &str = "admin-ui-service-token-0123456789abcdef";
const HMAC_SECRET: &str = "admin-ui-hmac-secret";
const ADMIN_TOKEN: &str = "admin-ui-admin-token-fedcba9876543210";
const USER: &str = "ui_user";
/// Posts a form without the CSRF field to the logout route, from the page itself.
const NO_CSRF_POST: &str = "(() => { const f = document.createElement('form'); f.method = 'post'; \
    f.action = '/admin/ui/logout'; document.body.appendChild(f); f.submit(); return true; })()";
/// The content type of a posted HTML form.
const FORM: &str = "application/x-www-form-urlencoded";

/// Accounts pay every minute from cash (so a settlement writes a ledger row); the pending-usage
/// loop runs every second.
const PRICING: &str = "[pricing]\ndefault_plan = \"metered\"\nsettle_interval_secs = 1\n\
    [pricing.plans.metered]\ncompute_allowed = true\nmonthly_minutes = 0\nhard_max_runtime_seconds = 7200\n";

/// Polls `f` every 100 ms until it gives `Some`; fails naming `what` after `limit`.
fn poll<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Headless Chromium, killed (its whole process group) when dropped.
struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    /// The browser's DevTools HTTP endpoint, `http://127.0.0.1:<port>`.
    devtools: String,
}

impl Browser {
    /// Fails the test, naming the script that installs it, when `chromium` is not on PATH.
    fn require() {
        let found = Command::new("chromium").arg("--version").output();
        assert!(
            found.as_ref().is_ok_and(|o| o.status.success()),
            "Debian's chromium is not installed (run scripts/install-deps.sh): {found:?}"
        );
    }

    fn start() -> Browser {
        use std::os::unix::process::CommandExt;
        Browser::require();
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new("chromium")
            .args(["--headless=new", "--no-sandbox", "--remote-debugging-port=0", "--no-first-run"])
            .args(["--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900", "--hide-scrollbars"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("starting chromium");
        // "DevTools listening on ws://127.0.0.1:<port>/devtools/browser/<id>" on stderr.
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("ws://").nth(1) {
                    let _ = tx.send(rest.split('/').next().unwrap_or("").to_owned());
                }
            }
        });
        let host = rx.recv_timeout(Duration::from_secs(60)).expect("chromium did not say its DevTools port in 60 s");
        Browser { child, _profile: profile, devtools: format!("http://{host}") }
    }

    /// A CDP session on the browser's first page.
    fn page(&self, http: &Client) -> Cdp {
        let ws = poll("chromium's page target", Duration::from_secs(30), || {
            let list: Value = http.get(format!("{}/json/list", self.devtools)).send().ok()?.json().ok()?;
            list.as_array()?
                .iter()
                .find(|t| t["type"] == "page")
                .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(str::to_owned))
        });
        let (socket, _) = tungstenite::connect(ws.as_str()).expect("CDP WebSocket");
        if let MaybeTlsStream::Plain(s) = socket.get_ref() {
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        }
        let mut cdp = Cdp { socket, next: 0 };
        cdp.call("Page.enable", json!({}));
        cdp.call("Network.enable", json!({}));
        cdp.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false}),
        );
        cdp
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) of the process group this test started chromium in.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.child.wait();
    }
}

/// One DevTools protocol session (commands answered in order; events skipped).
struct Cdp {
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    next: u64,
}

impl Cdp {
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.socket.send(Message::text(msg)).unwrap_or_else(|e| panic!("{method}: {e}"));
        loop {
            let Message::Text(text) = self.socket.read().unwrap_or_else(|e| panic!("{method}: {e}")) else {
                continue;
            };
            let v: Value = serde_json::from_str(text.as_str()).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call("Runtime.evaluate", json!({"expression": expr, "returnByValue": true}));
        assert!(r.get("exceptionDetails").is_none(), "{expr}: {r}");
        r["result"]["value"].clone()
    }

    /// Waits until `expr` is true in a fully loaded page that is not the one [`Cdp::leaving`] marked.
    fn wait_for(&mut self, what: &str, expr: &str) {
        let full = format!("!window.__left && document.readyState === 'complete' && !!({expr})");
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.eval(&full) != json!(true) {
            if Instant::now() >= deadline {
                let shown = self.eval("location.pathname + ' ' + (document.body ? document.body.innerText : '')");
                panic!("timed out waiting for {what}; the page shows {shown}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Marks the current document as left behind: a wait after a navigation never reads it.
    fn leaving(&mut self) {
        self.eval("window.__left = true");
    }

    fn go(&mut self, url: &str) {
        self.leaving();
        self.call("Page.navigate", json!({"url": url}));
    }

    /// Reloads `url` until `expr` holds (the page is rendered per request: new state needs a load).
    fn reload_until(&mut self, what: &str, url: &str, expr: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.go(url);
            self.wait_for(&format!("{url} to load"), &format!("location.href === {url:?}"));
            if self.eval(expr) == json!(true) {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what} on {url}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// Screenshots of the run, numbered in order.
struct Shots {
    dir: PathBuf,
    taken: usize,
}

impl Shots {
    /// `<target>/test-output/admin_ui`, emptied of earlier screenshots.
    fn new() -> Shots {
        let exe = std::env::current_exe().unwrap();
        // <target>/<profile>/deps/admin_ui-<hash>
        let target = exe.ancestors().nth(3).expect("the test binary is under <target>/<profile>/deps");
        let dir = target.join("test-output/admin_ui");
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "png") {
                std::fs::remove_file(e.path()).unwrap();
            }
        }
        Shots { dir, taken: 0 }
    }

    fn take(&mut self, cdp: &mut Cdp, name: &str) {
        use base64::Engine as _;
        let r = cdp.call("Page.captureScreenshot", json!({"format": "png", "captureBeyondViewport": true}));
        let png = base64::engine::general_purpose::STANDARD.decode(r["data"].as_str().expect("data")).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{name}: not a PNG");
        self.taken += 1;
        std::fs::write(self.dir.join(format!("{:02}-{name}.png", self.taken)), png).unwrap();
    }

    /// The directory relative to the repository, when it is inside it.
    fn shown_dir(&self) -> String {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let dir = self.dir.canonicalize().unwrap_or_else(|_| self.dir.clone());
        let repo = repo.canonicalize().unwrap_or_else(|_| repo.to_path_buf());
        dir.strip_prefix(&repo).map_or_else(|_| dir.display().to_string(), |p| p.display().to_string())
    }
}

/// A daemon with the Docker executor, its containers removed when dropped.
struct Daemon {
    serve: ServeProcess,
    http: Client,
    deployment: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        remove_containers(&self.deployment);
    }
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        let port = free_port();
        let deployment = format!("ui-{}", &uid()[20..]);
        let secrets =
            Secrets { service_token: SERVICE_TOKEN, hmac_secret: HMAC_SECRET, admin_token: Some(ADMIN_TOKEN) };
        let cfg = write_config(dir, port, &compute_toml(&deployment, &secrets, &docker_image(), PRICING));
        let serve = ServeProcess::start(dir, &cfg, port, "daemon.log", &[]);
        let http = Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
        let mut d = Daemon { serve, http, deployment };
        d.serve.wait_ready(&d.http);
        d
    }

    fn tool(&self, thread: &str, tool: &str, params: Value) -> Value {
        let (s, v) = signed_call(&self.http, &self.serve.base, HMAC_SECRET, (USER, thread), tool, params, None);
        assert_eq!(s, StatusCode::OK, "{tool}: {v}\nlog:\n{}", self.serve.warnings());
        v
    }

    fn admin(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        admin_call(&self.http, (&self.serve.base, ADMIN_TOKEN), method, path, body)
    }
}

/// `document.querySelector(sel)` exists (and, given, has `data-state` `state`).
fn row(sel: &str, state: Option<&str>) -> String {
    match state {
        Some(s) => format!("document.querySelector({sel:?})?.dataset.state === {s:?}"),
        None => format!("document.querySelector({sel:?}) !== null"),
    }
}

/// Without the cookie a page redirects to the login form; a cross-site login post and a logout
/// without the CSRF token are refused (HTTP, outside the browser).
fn check_http_refusals(d: &Daemon, session_cookie: &str) {
    let plain = Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let base = &d.serve.base;
    let resp = plain.get(format!("{base}/admin/ui/environments")).send().unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    assert_eq!(resp.headers()["location"], "/admin/ui/login");
    let resp = plain.get(format!("{base}/admin/ui/login")).send().unwrap();
    let csp = resp.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(csp.contains("default-src 'none'") && csp.contains("style-src 'self'"), "{csp}");
    let cross = plain
        .post(format!("{base}/admin/ui/login"))
        .header("Origin", "http://evil.example")
        .header("Content-Type", FORM)
        .body(format!("token={ADMIN_TOKEN}"))
        .send()
        .unwrap();
    assert_eq!(cross.status(), StatusCode::FORBIDDEN, "a cross-site login post is refused");
    assert!(cross.headers().get("set-cookie").is_none());
    let wrong =
        plain.post(format!("{base}/admin/ui/login")).header("Content-Type", FORM).body("token=wrong").send().unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let cookie = format!("scopefs_admin_session={session_cookie}");
    for body in ["", "csrf=forged"] {
        let post = plain.post(format!("{base}/admin/ui/logout")).header("Cookie", &cookie);
        let resp = post.header("Content-Type", FORM).body(body).send().unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "logout with {body:?}");
        assert!(resp.text().unwrap().contains("csrf_refused"));
    }
    let still = plain.get(format!("{base}/admin/ui/health")).header("Cookie", &cookie).send().unwrap();
    assert_eq!(still.status(), StatusCode::OK, "a refused logout ends nothing");
}

/// The browser's session cookie, checked HttpOnly, SameSite=Strict, path `/admin/ui`; its value.
fn session_cookie(cdp: &mut Cdp, base: &str) -> String {
    let cookies = cdp.call("Network.getCookies", json!({"urls": [format!("{base}/admin/ui")]}));
    let c = cookies["cookies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "scopefs_admin_session")
        .cloned()
        .unwrap_or_else(|| panic!("no session cookie: {cookies}"));
    assert_eq!((c["httpOnly"].as_bool(), c["sameSite"].as_str()), (Some(true), Some("Strict")), "{c}");
    assert_eq!(c["path"], "/admin/ui", "{c}");
    assert_eq!(c["value"].as_str().unwrap().len(), 64, "a 256-bit id");
    c["value"].as_str().unwrap().to_owned()
}

#[test]
fn the_admin_page_shows_scopes_environments_and_settlements_in_chromium() {
    let started = Instant::now();
    Browser::require();
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let base = d.serve.base.clone();
    let thread = format!("thr_{}", uid());
    let scope = provision(&d.http, &base, SERVICE_TOKEN, &thread, Some(USER));
    d.admin(
        reqwest::Method::POST,
        &format!("/admin/accounts/{USER}/credit"),
        Some(json!({"amount": "1.000000", "idempotency_key": "ui-credit"})),
    );
    d.tool(&thread, "write_file", json!({"path": "notes/hello.txt", "content": "hello from the admin page test"}));

    let browser = Browser::start();
    let mut cdp = browser.page(&d.http);
    let mut shots = Shots::new();

    // No cookie: the page redirects to the login form.
    cdp.go(&format!("{base}/admin/ui"));
    cdp.wait_for("the login form", "location.pathname === '/admin/ui/login' && document.getElementById('token')");
    shots.take(&mut cdp, "login-form");
    // Log in as a user would: type the token into the field and press Enter.
    cdp.eval("document.getElementById('token').focus()");
    cdp.call("Input.insertText", json!({"text": ADMIN_TOKEN}));
    cdp.leaving();
    for kind in ["keyDown", "keyUp"] {
        cdp.call(
            "Input.dispatchKeyEvent",
            json!({"type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "text": "\r"}),
        );
    }
    cdp.wait_for(
        "the scopes page after login",
        "location.pathname === '/admin/ui' && document.getElementById('logout')",
    );
    let cookie = session_cookie(&mut cdp, &base);
    assert_eq!(cdp.eval(&row(&format!("[data-scope='{scope}']"), None)), json!(true), "the test's scope is listed");
    shots.take(&mut cdp, "scopes-with-the-test-scope");

    // An environment appears with its process and cost so far.
    let body = json!({"default_output_paths": ["/workspace/out"], "max_runtime_seconds": 120});
    let env = d.tool(&thread, "create_environment", body)["environment_id"].as_str().unwrap().to_string();
    let cmd = "mkdir -p /workspace/out && printf 'a,b\\n1,2\\n' > /workspace/out/result.csv";
    assert_eq!(d.tool(&thread, "execute_command", json!({"environment_id": env, "command": cmd}))["exit_code"], 0);
    let process = d.tool(&thread, "start_process", json!({"environment_id": env, "command": "sleep 300"}));
    let process = process["process_id"].as_str().unwrap().to_string();
    let envs_url = format!("{base}/admin/ui/environments");
    let running = format!(
        "{} && {}",
        row(&format!("[data-env='{env}']"), Some("running")),
        row(&format!("[data-process='{process}']"), None)
    );
    cdp.reload_until("the running environment and its process", &envs_url, &running);
    let text = cdp.eval(&format!("document.querySelector(\"[data-env='{env}']\").innerText")).to_string();
    assert!(text.contains(USER) && text.contains(" min (0 free)") && text.contains("CNY"), "{text}");
    shots.take(&mut cdp, "environment-running");

    // The scope's files, listed through the engine.
    let scope_url = format!("{base}/admin/ui/scopes/{scope}");
    cdp.reload_until("the scope's files", &scope_url, &row("[data-path='/notes']", None));
    cdp.go(&format!("{scope_url}?path=/notes"));
    cdp.wait_for("the notes directory", &row("[data-path='/notes/hello.txt']", None));
    assert!(!cdp.eval("document.body.innerText").as_str().unwrap().contains("hello from"), "no file contents");
    shots.take(&mut cdp, "scope-files");

    // Destroyed: gone from the live list, ended on the scope's page.
    d.tool(&thread, "destroy_environment", json!({"environment_id": env}));
    cdp.reload_until(
        "the environment to leave the live list",
        &envs_url,
        &format!("!({})", row(&format!("[data-env='{env}']"), None)),
    );
    cdp.reload_until(
        "the ended environment",
        &scope_url,
        &row(&format!("#scope-environments [data-env='{env}']"), Some("ended")),
    );
    shots.take(&mut cdp, "environment-ended");

    // Settled by the daemon's loop (artifacts registered first): the usage and its ledger row.
    let settled = format!("document.querySelector(\"#settled [data-env='{env}']\")?.innerText.includes('result.csv')");
    cdp.reload_until("the settled usage with its artifact", &format!("{base}/admin/ui/usage"), &settled);
    shots.take(&mut cdp, "usage-settled-with-artifact");
    let ledger = d.admin(reqwest::Method::GET, &format!("/admin/accounts/{USER}/ledger"), None);
    let entry = ledger["entries"].as_array().unwrap().iter().find(|e| e["source_id"] == env.as_str()).cloned();
    let entry = entry.unwrap_or_else(|| panic!("no ledger row for {env}: {ledger}"));
    let row_sel = format!("#ledger [data-entry='{}'][data-source='{env}']", entry["entry_id"]);
    cdp.reload_until("the settlement's ledger row", &format!("{base}/admin/ui/accounts/{USER}"), &row(&row_sel, None));
    let shown = cdp.eval(&format!("document.querySelector(\"{row_sel}\").innerText")).to_string();
    assert!(shown.contains(entry["amount"].as_str().unwrap()) && shown.contains("compute_overtime"), "{shown}");
    shots.take(&mut cdp, "account-ledger");

    cdp.go(&format!("{base}/admin/ui/accounts"));
    cdp.wait_for("the accounts page", &row(&format!("#accounts [data-user='{USER}']"), None));
    let balance = d.admin(reqwest::Method::GET, &format!("/admin/accounts/{USER}"), None)["cash_balance"].clone();
    let shown = cdp.eval(&format!("document.querySelector(\"[data-user='{USER}']\").innerText"));
    assert!(shown.as_str().unwrap().contains(balance.as_str().unwrap()), "{shown} lacks the balance {balance}");
    shots.take(&mut cdp, "accounts");

    cdp.go(&format!("{base}/admin/ui/health"));
    cdp.wait_for("the health page", "document.getElementById('health')");
    for check in ["ready", "object store", "registry", "docker"] {
        let cell = cdp.eval(&format!("document.querySelector(\"[data-check='{check}']\")?.innerText"));
        assert!(cell.as_str().is_some_and(|t| t.contains("PASS")), "{check}: {cell}");
    }
    shots.take(&mut cdp, "health");
    // A path outside the scope through the API is refused and counted; the page shows the count.
    let outside = format!("{base}/api/workspace?threadId={thread}&path=%2e%2e%2fetc");
    let resp = d.http.get(outside).bearer_auth(SERVICE_TOKEN).send().unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    cdp.go(&format!("{base}/admin/ui/refusals"));
    cdp.wait_for("the refusals page", "document.querySelector(\"[data-bound]\")");
    let counted = cdp.eval("document.querySelector(\"[data-kind='path'][data-via='api']\")?.dataset.count");
    assert!(counted.as_str().and_then(|c| c.parse::<u64>().ok()).is_some_and(|c| c >= 1), "{counted}");
    shots.take(&mut cdp, "refusals");

    check_http_refusals(&d, &cookie);
    // A form posted without its CSRF token, from the page itself, is refused.
    cdp.leaving();
    cdp.eval(NO_CSRF_POST);
    cdp.wait_for("the CSRF refusal", "document.getElementById('error')?.innerText.includes('csrf_refused')");
    shots.take(&mut cdp, "logout-without-csrf-refused");
    // The real logout button ends the session; the pages then redirect to the login form.
    cdp.leaving();
    cdp.eval("document.querySelector('#logout button').click()");
    cdp.wait_for("the login form after logout", "location.pathname === '/admin/ui/login'");
    cdp.go(&format!("{base}/admin/ui/usage"));
    cdp.wait_for(
        "the redirect after logout",
        "location.pathname === '/admin/ui/login' && document.getElementById('token')",
    );
    let gone = Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let resp = gone
        .get(format!("{base}/admin/ui"))
        .header("Cookie", format!("scopefs_admin_session={cookie}"))
        .send()
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER, "the old session cookie is dead after logout");

    let log = d.serve.log_text();
    assert!(!log.contains(ADMIN_TOKEN) && !log.contains(&cookie), "the daemon logged a secret");
    println!("summary: admin_ui: {} screenshots in {}", shots.taken, shots.shown_dir());
    println!("admin_ui: passed in {:.1} s", started.elapsed().as_secs_f64());
}
