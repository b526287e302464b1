//! The checker of `openapi_conformance`: calls a route of the daemon and checks the answer against
//! the daemon's `/openapi.json` (status listed for the route, JSON body valid against the schema
//! of that status, binary body of the named content type), counting routes called and answers.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use reqwest::blocking::Client;
use serde_json::{json, Value};

use crate::compute_support::daemon::{ADMIN_TOKEN, HMAC_SECRET, SERVICE_TOKEN};
use crate::compute_support::signed_body;

/// Who a request authenticates as.
#[derive(Clone, Copy)]
enum As {
    Nobody,
    Service,
    Admin,
}

/// A request: its credentials, extra headers and body.
pub struct Ask {
    who: As,
    headers: Vec<(String, String)>,
    body: Option<(String, Vec<u8>)>,
}

impl Ask {
    /// No credentials.
    pub fn new() -> Ask {
        Ask { who: As::Nobody, headers: Vec::new(), body: None }
    }

    /// `Authorization: Bearer <service token>`.
    pub fn service() -> Ask {
        Ask { who: As::Service, ..Ask::new() }
    }

    /// `X-Admin-Token`.
    pub fn admin() -> Ask {
        Ask { who: As::Admin, ..Ask::new() }
    }

    pub fn json(self, body: Value) -> Ask {
        self.raw("application/json", serde_json::to_vec(&body).unwrap())
    }

    pub fn raw(mut self, content_type: &str, bytes: Vec<u8>) -> Ask {
        self.body = Some((content_type.to_string(), bytes));
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Ask {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

/// A checked answer, for the test to assert its status.
pub struct Answer {
    what: String,
    status: u16,
    json: Value,
    /// The `name=value` of the answer's first `Set-Cookie`, if any.
    pub cookie: Option<String>,
}

impl Answer {
    /// The answer had `status`; its JSON (`null` when it had none).
    pub fn expect(self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}: {}", self.what, self.json);
        self.json
    }

    /// The answer was the error `code` with `status`.
    pub fn expect_code(self, status: u16, code: &str) -> Value {
        assert_eq!(
            (self.status, self.json["error"]["code"].as_str()),
            (status, Some(code)),
            "{}: {}",
            self.what,
            self.json
        );
        self.json
    }

    /// Any status the document lists (checked when the answer came).
    pub fn expect_status(self) -> Value {
        self.json
    }
}

/// The daemon, its document, and what was called and checked.
pub struct Checker {
    base: String,
    client: Client,
    doc: Value,
    validators: HashMap<String, jsonschema::Validator>,
    called: BTreeSet<(String, String)>,
    answers: usize,
    json_validated: usize,
    requests_validated: usize,
}

impl Checker {
    /// Fetches the document of the daemon at `base`.
    pub fn new(base: &str) -> Checker {
        let client = Client::builder()
            .timeout(Duration::from_secs(120))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let doc: Value = client.get(format!("{base}/openapi.json")).send().unwrap().json().unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut checker = Checker {
            base: base.to_string(),
            client,
            doc,
            validators: HashMap::new(),
            called: BTreeSet::new(),
            answers: 0,
            json_validated: 0,
            requests_validated: 0,
        };
        checker.validation_is_live();
        checker
    }

    /// The validator rejects what the document rules out (an undeclared code, a missing field) and
    /// accepts what it allows, through the `$ref`s into `components`.
    fn validation_is_live(&mut self) {
        let schema =
            self.doc["paths"]["/ready"]["get"]["responses"]["503"]["content"]["application/json"]["schema"].clone();
        let mut check = |v: Value| self.errors("self-check", &schema, &v).is_empty();
        assert!(check(json!({"error": {"code": "not_ready", "message": "starting"}})));
        assert!(!check(json!({"error": {"code": "not_a_code", "message": "starting"}})));
        assert!(!check(json!({"error": {"code": "not_ready"}})));
        assert!(!check(json!({"status": "ready"})));
    }

    /// The (method, path) rows of the document whose path starts with `prefix`.
    pub fn paths_under(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (path, ops) in self.doc["paths"].as_object().unwrap() {
            if path.starts_with(prefix) {
                out.extend(ops.as_object().unwrap().keys().map(|m| (m.to_ascii_uppercase(), path.clone())));
            }
        }
        out
    }

    /// Calls `method url` (`template`: the route's path in the document) and checks the answer.
    pub fn call(&mut self, method: &str, template: &str, url: &str, ask: Ask) -> Answer {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.client.request(m, format!("{}{url}", self.base));
        match ask.who {
            As::Nobody => {}
            As::Service => req = req.bearer_auth(SERVICE_TOKEN),
            As::Admin => req = req.header("X-Admin-Token", ADMIN_TOKEN),
        }
        for (name, value) in &ask.headers {
            req = req.header(name, value);
        }
        let mut sent = None;
        if let Some((content_type, bytes)) = ask.body {
            if content_type == "application/json" {
                sent = serde_json::from_slice::<Value>(&bytes).ok();
            }
            req = req.header("Content-Type", content_type).body(bytes);
        }
        let resp = req.send().unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = resp.status().as_u16();
        let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let cookie = resp
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(str::to_string);
        let bytes = resp.bytes().unwrap().to_vec();
        let what = format!("{method} {url} -> {status}");
        let json = self.check(method, template, status, &content_type, &bytes, &what);
        if let Some(body) = sent.filter(|_| (200..300).contains(&status)) {
            self.check_request(method, template, &body, &what);
        }
        Answer { what, status, json, cookie }
    }

    /// A `/tools/<tool>` call signed as `thread` of `user-1`.
    pub fn tool(&mut self, thread: &str, tool: &str, params: Value) -> Answer {
        let (path, body) = signed_body(HMAC_SECRET, ("user-1", thread), tool, params, None);
        self.call("POST", &path.clone(), &path, Ask::new().json(body))
    }

    /// A `/tools/<tool>` call with `body` as it is (a bad signature).
    pub fn unsigned(&mut self, tool: &str, body: Value) -> Answer {
        let path = format!("/tools/{tool}");
        self.call("POST", &path.clone(), &path, Ask::new().json(body))
    }

    /// A JSON body the daemon accepted, against the document's request schema of the route.
    fn check_request(&mut self, method: &str, template: &str, body: &Value, what: &str) {
        let op = &self.doc["paths"][template][method.to_ascii_lowercase()];
        let schema = op["requestBody"]["content"]["application/json"]["schema"].clone();
        assert!(schema.is_object(), "{what}: a JSON body was accepted but the document names none");
        let errors = self.errors(&format!("{method} {template} request"), &schema, body);
        assert!(
            errors.is_empty(),
            "{what}: the accepted request does not match the document:\n{}\n{body}",
            errors.join("\n")
        );
        self.requests_validated += 1;
    }

    /// The errors of `instance` against `schema` (its `$ref`s resolved in the document).
    fn errors(&mut self, id: &str, schema: &Value, instance: &Value) -> Vec<String> {
        if !self.validators.contains_key(id) {
            let mut root = schema.clone();
            root["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
            root["components"] = self.doc["components"].clone();
            let v = jsonschema::draft202012::new(&root).unwrap_or_else(|e| panic!("{id}: bad schema: {e}"));
            self.validators.insert(id.to_string(), v);
        }
        self.validators[id].iter_errors(instance).map(|e| format!("{e} at {}", e.instance_path())).collect()
    }

    /// The answer against the document; its JSON (`null` for another content type).
    fn check(
        &mut self,
        method: &str,
        template: &str,
        status: u16,
        content_type: &str,
        bytes: &[u8],
        what: &str,
    ) -> Value {
        let op = &self.doc["paths"][template][method.to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {template} is not in the document");
        self.called.insert((method.to_string(), template.to_string()));
        self.answers += 1;
        let responses = &op["responses"];
        let documented = op.get("x-scopefs-undocumented").is_some();
        let key = if responses.get(status.to_string()).is_some() {
            status.to_string()
        } else if documented && responses.get("default").is_some() {
            "default".to_string()
        } else {
            let body = String::from_utf8_lossy(bytes);
            panic!("{what}: status {status} is not in the document ({responses}); body {body}");
        };
        let response = &responses[&key];
        let schema = &response["content"]["application/json"]["schema"];
        if schema.is_object() {
            let json: Value = serde_json::from_slice(bytes)
                .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", String::from_utf8_lossy(bytes)));
            let schema = schema.clone();
            let errors = self.errors(&format!("{method} {template} {key}"), &schema, &json);
            assert!(
                errors.is_empty(),
                "{what}: the answer does not match the document:\n{}\n{json}",
                errors.join("\n")
            );
            self.json_validated += 1;
            return json;
        }
        match response["content"].as_object() {
            Some(media) if !media.is_empty() => {
                let named = media.keys().any(|m| m == "*/*" || content_type.starts_with(m.as_str()));
                assert!(named || documented, "{what}: content type {content_type} is not one of {media:?}");
            }
            _ if !documented => assert!(bytes.is_empty(), "{what}: the document says no body"),
            _ => {}
        }
        Value::Null
    }

    /// Every (method, path) of the document was called; (routes, answers checked).
    pub fn finish(&self) -> (usize, usize) {
        let mut all = BTreeSet::new();
        for (path, ops) in self.doc["paths"].as_object().unwrap() {
            for m in ops.as_object().unwrap().keys() {
                all.insert((m.to_ascii_uppercase(), path.clone()));
            }
        }
        let missed: Vec<_> = all.difference(&self.called).collect();
        assert!(missed.is_empty(), "routes of the document never called: {missed:?}");
        println!(
            "openapi conformance: {} JSON answers and {} accepted JSON requests validated against their schemas",
            self.json_validated, self.requests_validated
        );
        (all.len(), self.answers)
    }
}
