//! HMAC signatures of `/tools/*` requests (seed 003 §4.3): Python-compatible canonical JSON, payload
//! hash, canonical string, HMAC-SHA256 and its constant-time verification.
//!
//! The signer (the gateway, in Python) computes
//! `json.dumps(body, ensure_ascii=False, sort_keys=True, separators=(",", ":"))` of the body without
//! `auth_context.token`. To verify, the body received is parsed here into a [`CanonValue`] that
//! behaves like Python's `json.loads` result, then printed the way `json.dumps` prints it:
//!
//! - integers keep their exact digits (any size; `-0` is the integer `0`);
//! - numbers with a fraction or an exponent are IEEE doubles, printed like Python's `float.__repr__`
//!   (shortest round-trip digits; fixed notation for `1e-4 <= |x| < 1e16` with at least one digit
//!   after the point, else `1e+16` / `1.5e-05`; `-0.0`; out-of-range values are `Infinity`);
//!   the literals `NaN`, `Infinity` and `-Infinity` are accepted, as `json.loads` does;
//! - strings are printed raw (UTF-8) except `"` `\` and the control characters below U+0020
//!   (`\n \r \t \b \f`, others `\u00XX` in lowercase hex); a lone surrogate (which Python could not
//!   encode to UTF-8 either) is refused;
//! - object keys are sorted by code point; a duplicate key keeps its last value, like Python.
//!
//! Nothing here logs; errors never contain the body, the token or the secret.

use std::collections::BTreeMap;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::limits::{self, Bound, LimitsConfig};

/// What one parse may build: at most `max_values` JSON values (every object, array, string, number,
/// literal) and at most `max_depth` nested arrays/objects. Checked before each value is built, so
/// a refused body never costs more than the budget (`[limits] tools_max_json_values`/`_depth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonBudget {
    pub max_values: u64,
    pub max_depth: u32,
}

impl JsonBudget {
    pub fn from_limits(l: &LimitsConfig) -> JsonBudget {
        JsonBudget { max_values: l.tools_max_json_values, max_depth: l.tools_max_json_depth }
    }
}

impl Default for JsonBudget {
    fn default() -> JsonBudget {
        JsonBudget::from_limits(&LimitsConfig::default())
    }
}

/// Why a signed body was refused. Messages never repeat the body, the token or the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigningError {
    #[error("body is not valid JSON: {0}")]
    BadJson(&'static str),
    #[error("body has more JSON values than allowed")]
    TooManyValues,
    #[error("body is nested deeper than allowed")]
    TooDeep,
    #[error("auth_context is missing or malformed: {0}")]
    BadAuthContext(&'static str),
    #[error("signature does not match")]
    BadSignature,
    #[error("issued_at is outside the accepted window")]
    OutsideWindow,
    #[error("nonce was already used")]
    Replayed,
}

/// A parsed JSON value with the semantics of Python's `json.loads` (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum CanonValue {
    Null,
    Bool(bool),
    /// An integer, as its canonical decimal text.
    Int(String),
    Float(f64),
    Str(String),
    Array(Vec<CanonValue>),
    /// Keys in code-point order (UTF-8 byte order is code-point order).
    Object(BTreeMap<String, CanonValue>),
}

impl CanonValue {
    /// Prints the value exactly like Python's `json.dumps(v, ensure_ascii=False, sort_keys=True,
    /// separators=(",", ":"))`.
    pub fn to_canonical(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            CanonValue::Null => out.push_str("null"),
            CanonValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            CanonValue::Int(digits) => out.push_str(digits),
            CanonValue::Float(f) => out.push_str(&python_float_repr(*f)),
            CanonValue::Str(s) => write_string(s, out),
            CanonValue::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
            CanonValue::Object(map) => {
                out.push('{');
                for (i, (k, v)) in map.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_string(k, out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`.
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `d[.ddd]e<exp>`. When the value lies
    // exactly halfway between two such strings Python picks the even last digit, which is the
    // correctly rounded (ties-to-even) value at that many digits: prefer it whenever it round-trips.
    let shortest = format!("{:e}", f.abs());
    let n = shortest.split_once('e').map_or(1, |(m, _)| m.chars().filter(char::is_ascii_digit).count());
    let rounded = format!("{:.*e}", n.saturating_sub(1), f.abs());
    let sci = if rounded.parse::<f64>() == Ok(f.abs()) { rounded } else { shortest };
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    // Value = 0.DIGITS * 10^decpt.
    let decpt = exp + 1;
    let mut out = String::new();
    if f < 0.0 {
        out.push('-');
    }
    if (-3..=16).contains(&decpt) {
        if decpt <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-decpt) as usize));
            out.push_str(&digits);
        } else {
            let d = decpt as usize;
            if digits.len() <= d {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', d - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..d]);
                out.push('.');
                out.push_str(&digits[d..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = decpt - 1;
        out.push_str(&format!("e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs()));
    }
    out
}

/// Parses a JSON document (UTF-8) with Python `json.loads` semantics, within the default budget.
pub fn parse(bytes: &[u8]) -> Result<CanonValue, SigningError> {
    parse_with(bytes, JsonBudget::default())
}

/// Parses a JSON document (UTF-8) with Python `json.loads` semantics, refusing it (and counting
/// the refusal) as soon as it exceeds `budget`.
pub fn parse_with(bytes: &[u8], budget: JsonBudget) -> Result<CanonValue, SigningError> {
    let text = std::str::from_utf8(bytes).map_err(|_| SigningError::BadJson("not UTF-8"))?;
    let mut p = Parser { s: text.as_bytes(), text, i: 0, values: 0, budget };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(SigningError::BadJson("trailing characters"));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
    /// Values started so far.
    values: u64,
    budget: JsonBudget,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    /// One value inside `depth` enclosing arrays/objects.
    fn value(&mut self, depth: u32) -> Result<CanonValue, SigningError> {
        self.values += 1;
        if self.values > self.budget.max_values {
            limits::refuse(Bound::JsonValues);
            return Err(SigningError::TooManyValues);
        }
        if matches!(self.peek(), Some(b'{' | b'[')) && depth >= self.budget.max_depth {
            limits::refuse(Bound::JsonDepth);
            return Err(SigningError::TooDeep);
        }
        match self.peek() {
            None => Err(SigningError::BadJson("unexpected end")),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(CanonValue::Str(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) if self.eat("true") => Ok(CanonValue::Bool(true)),
            Some(_) if self.eat("false") => Ok(CanonValue::Bool(false)),
            Some(_) if self.eat("null") => Ok(CanonValue::Null),
            Some(_) if self.eat("NaN") => Ok(CanonValue::Float(f64::NAN)),
            Some(_) if self.eat("Infinity") => Ok(CanonValue::Float(f64::INFINITY)),
            Some(_) => Err(SigningError::BadJson("unexpected character")),
        }
    }

    fn object(&mut self, depth: u32) -> Result<CanonValue, SigningError> {
        self.i += 1;
        let mut map = BTreeMap::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(CanonValue::Object(map));
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(SigningError::BadJson("expected a string key"));
            }
            let key = self.string()?;
            self.ws();
            if self.peek() != Some(b':') {
                return Err(SigningError::BadJson("expected ':'"));
            }
            self.i += 1;
            self.ws();
            let v = self.value(depth + 1)?;
            map.insert(key, v);
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(CanonValue::Object(map));
                }
                _ => return Err(SigningError::BadJson("expected ',' or '}'")),
            }
        }
    }

    fn array(&mut self, depth: u32) -> Result<CanonValue, SigningError> {
        self.i += 1;
        let mut items = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(CanonValue::Array(items));
        }
        loop {
            self.ws();
            items.push(self.value(depth + 1)?);
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(CanonValue::Array(items));
                }
                _ => return Err(SigningError::BadJson("expected ',' or ']'")),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, SigningError> {
        let h = self.s.get(self.i..self.i + 4).ok_or(SigningError::BadJson("short \\u escape"))?;
        let h = std::str::from_utf8(h).map_err(|_| SigningError::BadJson("bad \\u escape"))?;
        if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(SigningError::BadJson("bad \\u escape"));
        }
        self.i += 4;
        u32::from_str_radix(h, 16).map_err(|_| SigningError::BadJson("bad \\u escape"))
    }

    fn string(&mut self) -> Result<String, SigningError> {
        self.i += 1;
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.s.len() && !matches!(self.s[self.i], b'"' | b'\\') && self.s[self.i] >= 0x20 {
                self.i += 1;
            }
            out.push_str(&self.text[start..self.i]);
            match self.peek() {
                None => return Err(SigningError::BadJson("unterminated string")),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let esc = self.peek().ok_or(SigningError::BadJson("unterminated string"))?;
                    self.i += 1;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => out.push(self.unicode_escape()?),
                        _ => return Err(SigningError::BadJson("bad escape")),
                    }
                }
                // A raw control character: refused, as `json.loads` (strict) does.
                Some(_) => return Err(SigningError::BadJson("control character in string")),
            }
        }
    }

    /// After `\u`: one code point, joining a surrogate pair; a lone surrogate is refused.
    fn unicode_escape(&mut self) -> Result<char, SigningError> {
        let lone = SigningError::BadJson("lone surrogate");
        let hi = self.hex4()?;
        let cp = match hi {
            0xD800..=0xDBFF => {
                if !self.eat("\\u") {
                    return Err(lone);
                }
                let lo = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&lo) {
                    return Err(lone);
                }
                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(lone),
            cp => cp,
        };
        char::from_u32(cp).ok_or(lone)
    }

    fn number(&mut self) -> Result<CanonValue, SigningError> {
        let start = self.i;
        let negative = self.eat("-");
        if negative && self.eat("Infinity") {
            return Ok(CanonValue::Float(f64::NEG_INFINITY));
        }
        let digits = |p: &mut Self| {
            let d0 = p.i;
            while p.peek().is_some_and(|b| b.is_ascii_digit()) {
                p.i += 1;
            }
            p.i - d0
        };
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(SigningError::BadJson("bad number")),
        }
        let mut float = false;
        if self.peek() == Some(b'.') {
            // Python's scanner only takes the fraction when digits follow.
            if self.s.get(self.i + 1).is_some_and(|b| b.is_ascii_digit()) {
                self.i += 1;
                digits(self);
                float = true;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            let save = self.i;
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if digits(self) == 0 {
                self.i = save;
            } else {
                float = true;
            }
        }
        let text = &self.text[start..self.i];
        if float {
            let f: f64 = text.parse().map_err(|_| SigningError::BadJson("bad number"))?;
            return Ok(CanonValue::Float(f));
        }
        let magnitude = text.trim_start_matches('-');
        if magnitude == "0" {
            return Ok(CanonValue::Int("0".into()));
        }
        Ok(CanonValue::Int(text.to_string()))
    }
}

/// SHA-256 (lowercase hex) of the canonical JSON.
pub fn payload_hash(canonical_json: &str) -> String {
    hex::encode(Sha256::digest(canonical_json.as_bytes()))
}

/// `METHOD\nPATH\nissued_at\nnonce\nhash` (four LF, none trailing; the method upper-cased).
pub fn canonical_string(method: &str, path: &str, issued_at: &str, nonce: &str, body_hash: &str) -> String {
    [method.to_ascii_uppercase().as_str(), path, issued_at, nonce, body_hash].join("\n")
}

/// HMAC-SHA256 of `canonical` under `secret`, lowercase hex.
pub fn sign(secret: &[u8], canonical: &str) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(canonical.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// The verified `auth_context` of a request (without its token).
#[derive(Debug, Clone, PartialEq)]
pub struct AuthContext {
    pub user_id: Option<String>,
    pub thread_id: Option<String>,
    /// Unix seconds, as signed.
    pub issued_at: i64,
    pub nonce: String,
    /// `auth_context.object_scope`, if present (canonical JSON text).
    pub object_scope: Option<String>,
}

/// Verifies the signature of a `/tools/*` body for `method` and `path` (no query), within the
/// default JSON budget. Checks neither the time window nor the nonce: see [`check_window`] and the
/// registry's nonce store.
pub fn verify(secret: &[u8], method: &str, path: &str, body: &[u8]) -> Result<AuthContext, SigningError> {
    verify_with(secret, method, path, body, JsonBudget::default())
}

/// [`verify`] within `budget`. A body whose first non-blank byte does not open an object is
/// refused before anything is parsed.
pub fn verify_with(
    secret: &[u8],
    method: &str,
    path: &str,
    body: &[u8],
    budget: JsonBudget,
) -> Result<AuthContext, SigningError> {
    if body.iter().find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r')) != Some(&b'{') {
        return Err(SigningError::BadJson("the body must be a JSON object"));
    }
    let mut root = parse_with(body, budget)?;
    let CanonValue::Object(top) = &mut root else {
        return Err(SigningError::BadJson("the body must be a JSON object"));
    };
    let Some(CanonValue::Object(ctx)) = top.get_mut("auth_context") else {
        return Err(SigningError::BadAuthContext("auth_context must be an object"));
    };
    let Some(CanonValue::Str(token)) = ctx.remove("token") else {
        return Err(SigningError::BadAuthContext("token must be a string"));
    };
    let issued_at = match ctx.get("issued_at") {
        Some(CanonValue::Int(t)) => t.clone(),
        _ => return Err(SigningError::BadAuthContext("issued_at must be an integer")),
    };
    let nonce = match ctx.get("nonce") {
        Some(CanonValue::Str(n)) if crate::ids::is_token(n) => n.clone(),
        _ => return Err(SigningError::BadAuthContext("nonce must be 1-128 characters of [A-Za-z0-9_.:-]")),
    };
    let text = |k: &str| match ctx.get(k) {
        None | Some(CanonValue::Null) => Ok(None),
        Some(CanonValue::Str(s)) => Ok(Some(s.clone())),
        Some(_) => Err(SigningError::BadAuthContext("user_id and thread_id must be strings")),
    };
    let (user_id, thread_id) = (text("user_id")?, text("thread_id")?);
    let object_scope = ctx.get("object_scope").map(CanonValue::to_canonical);
    let canonical = canonical_string(method, path, &issued_at, &nonce, &payload_hash(&root.to_canonical()));
    if !token_matches(secret, &canonical, &token) {
        return Err(SigningError::BadSignature);
    }
    let issued_at = issued_at.parse::<i64>().map_err(|_| SigningError::OutsideWindow)?;
    Ok(AuthContext { user_id, thread_id, issued_at, nonce, object_scope })
}

/// Constant-time check of a presented lowercase-hex token.
fn token_matches(secret: &[u8], canonical: &str, token: &str) -> bool {
    if token.len() != 64 || !token.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return false;
    }
    let Ok(presented) = hex::decode(token) else { return false };
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(canonical.as_bytes());
    mac.verify_slice(&presented).is_ok()
}

/// `OutsideWindow` unless `issued_at` is within `window_secs` of `now_secs` (either side).
pub fn check_window(issued_at: i64, now_secs: i64, window_secs: u64) -> Result<(), SigningError> {
    let skew = issued_at.abs_diff(now_secs);
    if skew <= window_secs {
        Ok(())
    } else {
        Err(SigningError::OutsideWindow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"test-hmac-secret-for-unit-tests-only";
    const GOLDEN_JSON: &str = r#"{"auth_context":{"issued_at":1716500000,"nonce":"abc123def456","object_scope":{"read":["objects/in/data.csv"],"write_prefixes":["jobs/job_1/artifacts/"]},"user_id":"test_user"},"command":"echo hello","environment_id":"env_test123"}"#;
    const GOLDEN_HASH: &str = "45957f2078d85c7c09bedfea3f000b6a42a8e01e039250644bb577321186035b";
    const GOLDEN_TOKEN: &str = "06af87716e9c3ba83441362dad2faa543c5db19d1c47fb937cd2ffe29cee1d21";

    /// The golden body as a client sends it: other key order, whitespace, and the token.
    fn golden_body(token: &str) -> String {
        format!(
            r#"{{"command": "echo hello", "environment_id": "env_test123", "auth_context": {{"user_id": "test_user", "nonce": "abc123def456", "issued_at": 1716500000, "object_scope": {{"write_prefixes": ["jobs/job_1/artifacts/"], "read": ["objects/in/data.csv"]}}, "token": "{token}"}}}}"#
        )
    }

    #[test]
    fn golden_vector_of_seed_003() {
        let mut v = parse(golden_body(GOLDEN_TOKEN).as_bytes()).unwrap();
        if let CanonValue::Object(top) = &mut v {
            if let Some(CanonValue::Object(ctx)) = top.get_mut("auth_context") {
                ctx.remove("token");
            }
        }
        assert_eq!(v.to_canonical(), GOLDEN_JSON);
        assert_eq!(payload_hash(GOLDEN_JSON), GOLDEN_HASH);
        let canonical = canonical_string("post", "/tools/execute_command", "1716500000", "abc123def456", GOLDEN_HASH);
        assert_eq!(canonical, format!("POST\n/tools/execute_command\n1716500000\nabc123def456\n{GOLDEN_HASH}"));
        assert_eq!(canonical.matches('\n').count(), 4);
        assert_eq!(sign(SECRET, &canonical), GOLDEN_TOKEN);
        let ctx = verify(SECRET, "POST", "/tools/execute_command", golden_body(GOLDEN_TOKEN).as_bytes()).unwrap();
        assert_eq!((ctx.issued_at, ctx.nonce.as_str(), ctx.thread_id), (1716500000, "abc123def456", None));
        assert_eq!(ctx.user_id.as_deref(), Some("test_user"));
    }

    #[test]
    fn any_change_is_refused() {
        let body = golden_body(GOLDEN_TOKEN);
        let bad = |b: &str, path: &str| verify(SECRET, "POST", path, b.as_bytes()).unwrap_err();
        assert_eq!(
            bad(&body.replace("echo hello", "echo hellO"), "/tools/execute_command"),
            SigningError::BadSignature
        );
        assert_eq!(bad(&body, "/tools/read_file"), SigningError::BadSignature);
        let added = body.replacen('{', r#"{"extra": 1, "#, 1);
        assert_eq!(bad(&added, "/tools/execute_command"), SigningError::BadSignature);
        let removed = body.replace(r#""environment_id": "env_test123", "#, "");
        assert_eq!(bad(&removed, "/tools/execute_command"), SigningError::BadSignature);
        assert!(verify(b"other-secret", "POST", "/tools/execute_command", body.as_bytes()).is_err());
        let upper = body.replace(GOLDEN_TOKEN, &GOLDEN_TOKEN.to_ascii_uppercase());
        assert_eq!(bad(&upper, "/tools/execute_command"), SigningError::BadSignature);
        // CRLF instead of LF in the canonical string gives another token.
        let crlf = format!("POST\r\n/tools/execute_command\r\n1716500000\r\nabc123def456\r\n{GOLDEN_HASH}");
        assert_ne!(sign(SECRET, &crlf), GOLDEN_TOKEN);
        let crlf_body = golden_body(&sign(SECRET, &crlf));
        assert_eq!(bad(&crlf_body, "/tools/execute_command"), SigningError::BadSignature);
    }

    #[test]
    fn prints_like_python() {
        let canon = |s: &str| parse(s.as_bytes()).unwrap().to_canonical();
        assert_eq!(
            canon("[1.0, 100000.0, 1e16, 1e15, 0.0001, 0.00001, 1e-7, -0.0, 0.1, 1.5e300]"),
            "[1.0,100000.0,1e+16,1000000000000000.0,0.0001,1e-05,1e-07,-0.0,0.1,1.5e+300]"
        );
        // Exactly halfway between two 16-digit strings: Python keeps the even digit.
        assert_eq!(canon("[768165627601152.25, -768165627601152.25]"), "[768165627601152.2,-768165627601152.2]");
        assert_eq!(
            canon("[1e400, -1e400, NaN, -0, 123456789012345678901234567890, 1E2, 2.5e-3]"),
            "[Infinity,-Infinity,NaN,0,123456789012345678901234567890,100.0,0.0025]"
        );
        assert_eq!(canon(r#"{"b":1,"a":2,"b":3,"é":0,"z":0}"#), r#"{"a":2,"b":3,"z":0,"é":0}"#);
        assert_eq!(
            canon(r#""\u0001\b\f\n\r\t\"\\\/\u007f\u2028\ud83d\ude00é""#),
            "\"\\u0001\\b\\f\\n\\r\\t\\\"\\\\/\u{7f}\u{2028}\u{1f600}é\""
        );
        for bad in ["\"\u{1}\"", r#""\ud800""#, "[1,]", "01", "1.", "{\"a\" 1}", "tru", "[1] x"] {
            assert!(parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_budget_refuses_before_building_more() {
        let count = |label: &str| limits::refusals().into_iter().find(|(l, _)| *l == label).map_or(0, |(_, n)| n);
        // `[0,0,…]`: 10 000 integers and the array itself are 10 001 values.
        let flat = format!("[{}0]", "0,".repeat(9_999));
        let budget = |max_values, max_depth| JsonBudget { max_values, max_depth };
        let before = count("json_values");
        assert_eq!(parse_with(flat.as_bytes(), budget(10_000, 64)), Err(SigningError::TooManyValues));
        assert!(count("json_values") > before, "the refusal is counted");
        assert!(
            matches!(parse_with(flat.as_bytes(), budget(10_001, 64)), Ok(CanonValue::Array(v)) if v.len() == 10_000)
        );
        // The default budget refuses a 2.2 MB `[0,0,…]` (1.1 M values) too.
        let big = format!("[{}0]", "0,".repeat(1_100_000));
        assert_eq!(parse(big.as_bytes()), Err(SigningError::TooManyValues));

        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let before = count("json_depth");
        assert_eq!(parse_with(nested(65).as_bytes(), budget(1000, 64)), Err(SigningError::TooDeep));
        assert!(count("json_depth") > before);
        assert!(parse_with(nested(64).as_bytes(), budget(1000, 64)).is_ok());
        assert_eq!(parse(nested(100_000).as_bytes()), Err(SigningError::TooDeep), "no stack overflow either");
        let obj = |n: usize| format!("{}1{}", "{\"a\":".repeat(n), "}".repeat(n));
        assert_eq!(parse_with(obj(3).as_bytes(), budget(1000, 2)), Err(SigningError::TooDeep));
        assert!(parse_with(obj(2).as_bytes(), budget(1000, 2)).is_ok());

        // A body that is not an object is refused before it is parsed, whatever its size.
        assert_eq!(
            verify_with(SECRET, "POST", "/tools/read_file", big.as_bytes(), budget(10, 64)),
            Err(SigningError::BadJson("the body must be a JSON object"))
        );
        let wrapped = format!("{{\"x\":{flat}}}");
        assert_eq!(
            verify_with(SECRET, "POST", "/tools/read_file", wrapped.as_bytes(), budget(100, 64)),
            Err(SigningError::TooManyValues)
        );
    }

    #[test]
    fn window_is_symmetric() {
        assert!(check_window(1000, 1300, 300).is_ok());
        assert!(check_window(1300, 1000, 300).is_ok());
        assert_eq!(check_window(1000, 1301, 300), Err(SigningError::OutsideWindow));
        assert_eq!(check_window(1301, 1000, 300), Err(SigningError::OutsideWindow));
    }
}
