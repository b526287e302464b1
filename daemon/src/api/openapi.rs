//! The OpenAPI 3.1 document of the route table: each row's [`Doc`] (request body, answers per
//! status, query parameters, error codes) emitted with JSON Schemas generated from the Rust types.
//!
//! Library: `schemars`. It derives JSON Schema 2020-12 from the very types the handlers serialize
//! and deserialize, honouring their serde attributes (renames, `skip_serializing_if`, `flatten`,
//! `default`), and OpenAPI 3.1's schema dialect *is* 2020-12, so its output goes into
//! `components.schemas` as it is. `utoipa` would also generate the paths, but from attribute
//! macros on each handler: a second route list beside `routes.rs`, which stays the one table.

use std::collections::BTreeMap;

use schemars::generate::{Contract, SchemaSettings};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{json, Map, Value};

use super::error::{ErrorBody, ErrorCode};
use super::routes::{Auth, RouteSpec};

/// Generates the schema of one type (a `$ref` into `components.schemas` for named types).
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

fn schema_of<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

fn inline_schema_of<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    T::json_schema(g)
}

/// A signed `/tools/*` body: the tool's parameters `P` (inline) and the `auth_context`.
fn signed_schema_of<P: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    let context = g.subschema_for::<AuthContextDoc>().to_value();
    let mut schema = P::json_schema(g);
    let obj = schema.ensure_object();
    obj.entry("type").or_insert_with(|| json!("object"));
    obj.entry("properties").or_insert_with(|| json!({}))["auth_context"] = context;
    if let Some(required) = obj.entry("required").or_insert_with(|| json!([])).as_array_mut() {
        required.push(json!("auth_context"));
    }
    schema
}

/// A request body or a success answer.
#[derive(Debug, Clone, Copy)]
pub enum Content {
    /// `application/json` of a Rust type.
    Json(SchemaFn),
    /// Another content type (a stream, a zip, a multipart form, text), described by its media type.
    Media(&'static str),
    /// No body at all (a request without one, a `204`).
    Empty,
}

/// A string parameter: its name, where it goes (`query` or `header`), whether it is required,
/// and what it means.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    pub location: &'static str,
    pub required: bool,
    pub description: &'static str,
}

/// The `auth_context` of a signed `/tools/*` body (seed 003 §4.3), checked by the daemon's
/// signature verification.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[schemars(rename = "AuthContext")]
pub struct AuthContextDoc {
    pub user_id: String,
    pub thread_id: String,
    /// Unix seconds; within `tools.signature_window_secs` of the daemon's clock.
    pub issued_at: i64,
    /// Single use.
    pub nonce: String,
    /// HMAC-SHA256 (lowercase hex) of `METHOD\nPATH\nissued_at\nnonce\nsha256(canonical body)`.
    pub token: String,
    #[serde(default)]
    pub object_scope: Option<ObjectScopeDoc>,
}

/// `auth_context.object_scope`: the paths the call may read and the prefixes it may write.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[schemars(rename = "ObjectScope")]
pub struct ObjectScopeDoc {
    #[serde(default)]
    pub read: Vec<String>,
    #[serde(default)]
    pub write_prefixes: Vec<String>,
}

/// The documentation of one route: chained onto its row, `table.add(...).doc(Doc::new()...)`.
#[derive(Debug, Clone, Default)]
pub struct Doc {
    /// `None`: not documented; `Some(Content::Empty)`: the route takes no body.
    pub body: Option<Content>,
    /// Success answers by status.
    pub answers: Vec<(u16, Content)>,
    pub params: Vec<Param>,
    /// Query parameters given by a type (each property one parameter).
    pub query_types: Vec<SchemaFn>,
    /// Codes the route itself can answer (those of its authentication class are added).
    pub errors: Vec<ErrorCode>,
    /// The route is a page of the admin UI: its errors are HTML pages (naming the code), not JSON.
    pub html_errors: bool,
}

impl Doc {
    pub fn new() -> Doc {
        Doc::default()
    }

    /// A JSON request body of type `T`.
    pub fn body<T: JsonSchema>(mut self) -> Doc {
        self.body = Some(Content::Json(schema_of::<T>));
        self
    }

    /// A signed `/tools/*` body: the parameters `P` beside `auth_context`.
    pub fn signed_body<P: JsonSchema>(mut self) -> Doc {
        self.body = Some(Content::Json(signed_schema_of::<P>));
        self
    }

    /// A request body of another content type (multipart, a raw stream).
    pub fn body_media(mut self, media: &'static str) -> Doc {
        self.body = Some(Content::Media(media));
        self
    }

    /// The route takes no body.
    pub fn no_body(mut self) -> Doc {
        self.body = Some(Content::Empty);
        self
    }

    /// A JSON success answer of type `T` with `status`.
    pub fn ok<T: JsonSchema>(mut self, status: u16) -> Doc {
        self.answers.push((status, Content::Json(schema_of::<T>)));
        self
    }

    /// A success answer of another content type.
    pub fn ok_media(mut self, status: u16, media: &'static str) -> Doc {
        self.answers.push((status, Content::Media(media)));
        self
    }

    /// A success answer without a body (a 204, or a redirect: an admin UI form's post, or its page
    /// asked for without a session).
    pub fn ok_empty(mut self, status: u16) -> Doc {
        self.answers.push((status, Content::Empty));
        self
    }

    /// The query parameters of `T` (each of its properties; required as `T` requires them).
    pub fn query<T: JsonSchema>(mut self) -> Doc {
        self.query_types.push(inline_schema_of::<T>);
        self
    }

    /// One string query parameter.
    pub fn param(mut self, name: &'static str, required: bool, description: &'static str) -> Doc {
        self.params.push(Param { name, location: "query", required, description });
        self
    }

    /// One optional request header the route reads.
    pub fn header(mut self, name: &'static str, description: &'static str) -> Doc {
        self.params.push(Param { name, location: "header", required: false, description });
        self
    }

    /// A page of the admin UI: `text/html` at 200 and error pages in HTML (with `codes`).
    pub fn html_page(mut self, codes: &[ErrorCode]) -> Doc {
        self.html_errors = true;
        self.errors(codes)
    }

    /// The error codes the route answers (besides those of its authentication class).
    pub fn errors(mut self, codes: &[ErrorCode]) -> Doc {
        self.errors.extend_from_slice(codes);
        self
    }

    /// Every error code of the route: its own, its class's, and those of its request's shape.
    pub fn all_errors(&self, spec: &RouteSpec) -> Vec<ErrorCode> {
        let mut codes = self.errors.clone();
        codes.extend_from_slice(class_errors(spec.auth));
        if matches!(self.body, Some(Content::Json(_))) && spec.auth != Auth::Signed {
            codes.push(ErrorCode::InvalidJson);
        }
        if !self.query_types.is_empty() || self.params.iter().any(|p| p.location == "query") {
            codes.push(ErrorCode::InvalidQuery);
        }
        if spec.path.contains('{') {
            codes.push(ErrorCode::InvalidPath);
        }
        codes.sort();
        codes.dedup();
        codes
    }
}

/// The codes every route of an authentication class can answer.
pub fn class_errors(auth: Auth) -> &'static [ErrorCode] {
    use ErrorCode as E;
    match auth {
        Auth::Public | Auth::AdminSession => &[],
        Auth::Service => &[E::Unauthorized, E::NotReady, E::RequestTimeout, E::ScopeMoving, E::TaskFailed],
        Auth::Admin => &[E::Unauthorized, E::RequestTimeout, E::TaskFailed],
        Auth::Signed => &[
            E::InvalidSignature,
            E::SignatureExpired,
            E::NonceReplayed,
            E::InvalidAuthContext,
            E::InvalidThreadId,
            E::InvalidRequest,
            E::InvalidJson,
            E::InvalidBody,
            E::TooLarge,
            E::BodyTimeout,
            E::Busy,
            E::NotReady,
            E::ScopeNotFound,
            E::UserBusy,
            E::ScopeBusy,
            E::RequestTimeout,
            E::TaskFailed,
        ],
    }
}

/// The two generators: requests are read (serde's deserialize contract: `default` fields are
/// optional), answers are written (serialize contract: `skip_serializing_if` fields are optional).
struct Generators {
    requests: SchemaGenerator,
    answers: SchemaGenerator,
}

impl Generators {
    fn new() -> Generators {
        let settings = || {
            SchemaSettings::draft2020_12().with(|s| {
                s.definitions_path = "/components/schemas".into();
                s.meta_schema = None;
            })
        };
        Generators {
            requests: settings().with(|s| s.contract = Contract::Deserialize).into_generator(),
            answers: settings().with(|s| s.contract = Contract::Serialize).into_generator(),
        }
    }

    /// Every named schema of both generators, and the names both generated differently: a type
    /// read and written with different shapes (serde attributes that differ by direction) would
    /// need two names; the answer's is kept, and the table's test fails on any.
    fn components(mut self) -> (Map<String, Value>, Vec<String>) {
        let mut all = self.answers.take_definitions(true);
        let mut clashes = Vec::new();
        for (name, schema) in self.requests.take_definitions(true) {
            match all.get(&name) {
                Some(existing) if *existing != schema => clashes.push(name),
                _ => {
                    all.insert(name, schema);
                }
            }
        }
        (all, clashes)
    }
}

fn content_json(media: &str, schema: Value) -> Value {
    json!({ media: { "schema": schema } })
}

/// The error answers of a route: one response per status, its body the error schema with the
/// route's codes of that status.
/// The error answers of `codes` by status: the JSON error body restricted to the codes of each
/// status, or (`html`: an admin UI page) an HTML page naming the code.
fn error_responses(codes: &[ErrorCode], html: bool) -> BTreeMap<u16, Value> {
    let mut by_status: BTreeMap<u16, Vec<&str>> = BTreeMap::new();
    for code in codes {
        for status in code.statuses() {
            by_status.entry(*status).or_default().push(code.as_str());
        }
    }
    by_status
        .into_iter()
        .map(|(status, codes)| {
            let description = format!("error: {}", codes.join(", "));
            if html {
                return (status, json!({ "description": description, "content": { "text/html": {} } }));
            }
            let schema = json!({
                "allOf": [
                    { "$ref": "#/components/schemas/ErrorBody" },
                    { "properties": { "error": { "properties": { "code": { "enum": codes } } } } },
                ],
            });
            (status, json!({ "description": description, "content": content_json("application/json", schema) }))
        })
        .collect()
}

fn query_params(doc: &Doc, g: &mut SchemaGenerator) -> Vec<Value> {
    let mut out = Vec::new();
    for of in &doc.query_types {
        let schema = of(g).to_value();
        let required: Vec<&str> =
            schema["required"].as_array().map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        for (name, prop) in schema["properties"].as_object().into_iter().flatten() {
            let mut param = json!({
                "name": name, "in": "query", "required": required.contains(&name.as_str()), "schema": prop,
            });
            if let Some(d) = prop.get("description") {
                param["description"] = d.clone();
            }
            out.push(param);
        }
    }
    for p in &doc.params {
        out.push(json!({
            "name": p.name, "in": p.location, "required": p.required, "description": p.description,
            "schema": { "type": "string" },
        }));
    }
    out
}

fn operation(s: &RouteSpec, gens: &mut Generators) -> Value {
    let mut params: Vec<Value> = s
        .path
        .split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|p| p.strip_suffix('}')))
        .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
        .collect();
    let mut op = json!({ "summary": s.summary, "x-scopefs-auth": s.auth.as_str() });
    let mut responses = Map::new();
    match &s.doc {
        None => {
            op["x-scopefs-undocumented"] = json!(true);
            responses.insert("default".into(), json!({"description": "not documented yet"}));
        }
        Some(doc) => {
            params.extend(query_params(doc, &mut gens.requests));
            match doc.body {
                Some(Content::Json(of)) => {
                    let schema = of(&mut gens.requests).to_value();
                    op["requestBody"] =
                        json!({ "required": true, "content": content_json("application/json", schema) });
                }
                Some(Content::Media(media)) => {
                    op["requestBody"] = json!({ "required": true, "content": { media: {} } });
                }
                Some(Content::Empty) | None => {}
            }
            for (status, answer) in &doc.answers {
                let r = match answer {
                    Content::Json(of) => json!({
                        "description": "success",
                        "content": content_json("application/json", of(&mut gens.answers).to_value()),
                    }),
                    Content::Media(media) => json!({ "description": "success", "content": { *media: {} } }),
                    Content::Empty => json!({ "description": "success, no body" }),
                };
                responses.insert(status.to_string(), r);
            }
            for (status, r) in error_responses(&doc.all_errors(s), doc.html_errors) {
                responses.insert(status.to_string(), r);
            }
        }
    }
    op["responses"] = Value::Object(responses);
    if !params.is_empty() {
        op["parameters"] = Value::Array(params);
    }
    match s.auth {
        Auth::Service => op["security"] = json!([{"serviceToken": []}]),
        Auth::Admin => op["security"] = json!([{"adminToken": []}]),
        Auth::AdminSession => op["security"] = json!([{"adminSession": []}]),
        Auth::Public | Auth::Signed => {}
    }
    op
}

/// An OpenAPI 3.1 document of the table.
pub fn openapi(specs: &[RouteSpec]) -> Value {
    let (doc, clashes) = document(specs);
    if !clashes.is_empty() {
        tracing::warn!(?clashes, "types read and written with different schemas share a name");
    }
    doc
}

/// The document, and the schema names requests and answers generated differently.
fn document(specs: &[RouteSpec]) -> (Value, Vec<String>) {
    let mut gens = Generators::new();
    gens.answers.subschema_for::<ErrorBody>();
    let mut paths = Map::new();
    for s in specs {
        let op = operation(s, &mut gens);
        let entry = paths.entry(s.path.to_string()).or_insert_with(|| json!({}));
        entry[s.method.to_ascii_lowercase()] = op;
    }
    let (schemas, clashes) = gens.components();
    let doc = json!({
        "openapi": "3.1.0",
        "info": {"title": "scopefs", "version": env!("CARGO_PKG_VERSION")},
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "serviceToken": {"type": "http", "scheme": "bearer"},
                "adminToken": {"type": "apiKey", "in": "header", "name": "X-Admin-Token"},
                "adminSession": {"type": "apiKey", "in": "cookie", "name": "scopefs_admin_session"},
            },
        },
    });
    (doc, clashes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows not documented yet (method, path): this list can only shrink (it is empty: every row
    /// is documented). A new row without a [`Doc`] fails the test below, and so does a documented
    /// row still listed here.
    const UNDOCUMENTED: &[(&str, &str)] = &[];

    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r.clone());
                }
                m.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    /// Acceptance a of issue 25: every row documents a success answer, every method with a body
    /// its request body, and every error answer has the error schema with the row's codes.
    #[test]
    fn every_route_of_the_table_is_documented() {
        let specs = super::super::route_table().specs;
        let (doc, clashes) = document(&specs);
        assert!(clashes.is_empty(), "schema names read and written differently: {clashes:?}");
        let mut undocumented: Vec<(&str, &str)> =
            specs.iter().filter(|s| s.doc.is_none()).map(|s| (s.method, s.path)).collect();
        undocumented.sort();
        let mut listed = UNDOCUMENTED.to_vec();
        listed.sort();
        assert_eq!(undocumented, listed, "undocumented rows (document a new row with .doc(...))");
        for s in specs.iter().filter(|s| s.doc.is_some()) {
            let op = &doc["paths"][s.path][s.method.to_ascii_lowercase()];
            let responses = op["responses"].as_object().unwrap();
            // A success: 2xx, or a redirect (an admin UI form's post, or its page without a session).
            let success = responses.keys().filter(|k| k.starts_with('2') || k.starts_with('3')).count();
            assert!(success > 0, "{} {} documents no success answer", s.method, s.path);
            let html = s.doc.as_ref().unwrap().html_errors;
            if matches!(s.method, "POST" | "PUT" | "PATCH") {
                assert!(s.doc.as_ref().unwrap().body.is_some(), "{} {}: request body undocumented", s.method, s.path);
            }
            for (status, r) in responses.iter().filter(|(k, _)| k.starts_with('4') || k.starts_with('5')) {
                if html {
                    assert!(r["content"]["text/html"].is_object(), "{} {} {status}: an HTML page", s.method, s.path);
                    continue;
                }
                let schema = &r["content"]["application/json"]["schema"];
                assert_eq!(
                    schema["allOf"][0]["$ref"], "#/components/schemas/ErrorBody",
                    "{} {} {status}",
                    s.method, s.path
                );
                let codes = schema["allOf"][1]["properties"]["error"]["properties"]["code"]["enum"].as_array().unwrap();
                for code in codes {
                    let code = ErrorCode::of(code.as_str().unwrap()).unwrap();
                    assert!(code.statuses().contains(&status.parse().unwrap()), "{code:?} under {status}");
                }
            }
            for (name, param) in s.path.split('/').filter_map(|p| p.strip_prefix('{')).zip(0..) {
                assert_eq!(op["parameters"][param]["name"], name.trim_end_matches('}'));
            }
        }
        let mut all = Vec::new();
        refs(&doc, &mut all);
        for r in all {
            let name = r.strip_prefix("#/components/schemas/").unwrap_or_else(|| panic!("a $ref outside: {r}"));
            assert!(doc["components"]["schemas"].get(name).is_some(), "{r} is not in components.schemas");
        }
    }

    #[test]
    fn a_documented_row_has_its_body_answers_parameters_and_error_codes() {
        use super::super::routes::RouteTable;
        use axum::routing::{get, post};
        #[derive(serde::Deserialize, JsonSchema)]
        struct Ask {
            name: String,
            #[serde(default)]
            size: Option<u64>,
        }
        #[derive(serde::Serialize, JsonSchema)]
        struct Answer {
            id: String,
        }
        // The body the row documents is the one its handler reads.
        let ask: Ask = serde_json::from_value(json!({"name": "n"})).unwrap();
        assert_eq!((ask.name.as_str(), ask.size), ("n", None));
        let t: RouteTable<()> = RouteTable::new()
            .add("POST", "/a/{id}", Auth::Service, "make", post(|| async {}))
            .doc(Doc::new().body::<Ask>().ok::<Answer>(201).ok::<Answer>(200).errors(&[ErrorCode::ScopeBusy]))
            .add("GET", "/a", Auth::Admin, "list", get(|| async {}))
            .doc(Doc::new().query::<Ask>().param("after", false, "page").ok_media(200, "application/zip"))
            .add("GET", "/health", Auth::Public, "live", get(|| async {}));
        let doc = openapi(&t.specs);
        let make = &doc["paths"]["/a/{id}"]["post"];
        assert_eq!(make["requestBody"]["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/Ask");
        assert_eq!(
            make["responses"]["201"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/Answer"
        );
        let codes =
            |status: &str| make["responses"][status]["content"]["application/json"]["schema"]["allOf"][1].clone();
        assert_eq!(codes("409")["properties"]["error"]["properties"]["code"]["enum"], json!(["scope_busy"]));
        assert_eq!(codes("429")["properties"]["error"]["properties"]["code"]["enum"], json!(["scope_busy"]));
        assert!(codes("401").to_string().contains("unauthorized"));
        assert!(codes("400").to_string().contains("invalid_json"), "a JSON body can be refused");
        assert_eq!(doc["components"]["schemas"]["Ask"]["required"], json!(["name"]));
        let list = &doc["paths"]["/a"]["get"];
        let names: Vec<&str> =
            list["parameters"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["name", "size", "after"]);
        assert_eq!(list["parameters"][0]["required"], true);
        assert_eq!(list["parameters"][1]["required"], false);
        assert!(list["responses"]["200"]["content"]["application/zip"].is_object());
        assert_eq!(doc["paths"]["/health"]["get"]["x-scopefs-undocumented"], true);
        let error_code = &doc["components"]["schemas"]["ErrorCode"]["enum"];
        assert_eq!(error_code.as_array().unwrap().len(), ErrorCode::ALL.len());
    }
}
