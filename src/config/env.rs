//! The `SCOPEFS_*` environment overlay of the configuration: every key of every section,
//! `SCOPEFS_<KEY>` for a top-level key and `SCOPEFS_<SECTION>_<KEY>` for a key of a section
//! (`SCOPEFS_FUSE_THREADS`, `SCOPEFS_LIMITS_MAX_PATH_DEPTH`), plus `SCOPEFS_S3_<KEY>` for the
//! S3 store. The keys come from the serde structure itself (the serialized configuration and the
//! field lists of its `deny_unknown_fields` types), so a new key is covered without an entry here.
//! Values parse strictly, as the key's type; an unknown `SCOPEFS_*` name is refused unless it is
//! in [`NON_CONFIG_ENV`]. Nested tables (`[pricing.plans.<name>]`) are set in the file only.

use std::fmt;

use serde::de::value::MapDeserializer;
use serde::de::{DeserializeOwned, IntoDeserializer, Visitor};
use serde::Deserializer;
use toml::{Table, Value};

use super::{Config, ConfigError, StoreConfig};

const PREFIX: &str = "SCOPEFS_";

/// `SCOPEFS_*` names that are not configuration keys: read by the daemon itself, its supervisor
/// and worker, systemd units, the test hooks, or the test and bench scripts. A trailing `*`
/// matches every name with that prefix. Any other `SCOPEFS_*` name must be a configuration key.
pub const NON_CONFIG_ENV: &[&str] = &[
    // `--config` (daemon/src/main.rs) and logging (daemon/src/setup.rs).
    "SCOPEFS_CONFIG",
    "SCOPEFS_LOG",
    "SCOPEFS_LOG_FORMAT",
    // The supervisor and its worker (daemon/src/supervisor.rs, notify.rs, fdstore.rs,
    // datadir_lock.rs) and the systemd unit's file-descriptor store (systemd/scopefs.service).
    "SCOPEFS_SERVE_ROLE",
    "SCOPEFS_NOTIFY_FD",
    "SCOPEFS_LISTEN_FDNAMES_FD",
    "SCOPEFS_DATA_LOCK_FD",
    "SCOPEFS_WORKER_CRASHES",
    "SCOPEFS_WORKER_RESTART_DELAY_MS",
    "SCOPEFS_FDSTORE",
    // `scopefs doctor` (daemon/src/doctor.rs).
    "SCOPEFS_DOCTOR_FUSE_DEVICE",
    // Test hooks (src/testhooks.rs; only test builds honour them).
    "SCOPEFS_FAILPOINT",
    // Test harnesses and the test script (tests/, scripts/test.sh, scripts/garage.sh), the
    // test clock and the FUSE stall hook among them.
    "SCOPEFS_TEST_*",
    "SCOPEFS_CRASH_ROUNDS",
    "SCOPEFS_BILLING_TEST_CHILD_DB",
    // The installed release binary under test (scripts/package-test.sh).
    "SCOPEFS_RELEASE_BIN",
    // scripts/bench-compare.sh.
    "SCOPEFS_BIN",
    "SCOPEFS_BENCH_FUSE",
    "SCOPEFS_BENCH_READAHEAD_KB",
    "SCOPEFS_BENCH_ENV",
];

/// Former names that keep working: (name after `SCOPEFS_`, lower case; the name it stands for).
const ALIASES: &[(&str, &str)] = &[("attr_ttl_ms", "fuse_attr_ttl_ms")];

/// Whether `var` is a `SCOPEFS_*` name listed in [`NON_CONFIG_ENV`].
pub fn is_non_config_env(var: &str) -> bool {
    NON_CONFIG_ENV.iter().any(|allowed| match allowed.strip_suffix('*') {
        Some(prefix) => var.starts_with(prefix),
        None => var == *allowed,
    })
}

/// Applies one environment variable to `cfg`; names without the `SCOPEFS_` prefix are ignored.
pub(super) fn apply(cfg: &mut Config, var: &str, value: &str) -> Result<(), ConfigError> {
    let Some(name) = var.strip_prefix(PREFIX) else { return Ok(()) };
    if is_non_config_env(var) {
        return Ok(());
    }
    let bad = |reason: String| ConfigError::Env { key: var.to_string(), reason };
    let mut name = name.to_ascii_lowercase();
    if let Some((_, canonical)) = ALIASES.iter().find(|(alias, _)| *alias == name) {
        name = canonical.to_string();
    }
    let mut root = Table::try_from(&*cfg).map_err(|e| bad(e.to_string()))?;
    if let Some(key) = name.strip_prefix("s3_") {
        use_s3_store(&mut root).map_err(|e| bad(e.to_string()))?;
        name = format!("store_{key}");
    }
    let Some((section, key)) = locate(&root, &name) else {
        return Err(ConfigError::UnknownEnv(var.to_string()));
    };
    let target = match section {
        None => &mut root,
        Some(section) => match root.get_mut(&section).and_then(Value::as_table_mut) {
            Some(table) => table,
            None => return Err(ConfigError::UnknownEnv(var.to_string())),
        },
    };
    let typed = typed_value(target.get(&key), value).map_err(|reason| bad(reason.to_string()))?;
    target.insert(key, typed);
    *cfg = Value::Table(root).try_into().map_err(|e: toml::de::Error| bad(e.message().to_string()))?;
    Ok(())
}

/// Turns the store into an S3 store (empty bucket, region `us-east-1`) unless it is one already.
fn use_s3_store(root: &mut Table) -> Result<(), toml::ser::Error> {
    let kind = root.get("store").and_then(|s| s.get("kind")).and_then(Value::as_str);
    if kind != Some("s3") {
        let fresh = StoreConfig::S3 {
            endpoint: None,
            region: "us-east-1".into(),
            bucket: String::new(),
            prefix: String::new(),
            path_style: true,
            access_key_id: None,
            secret_access_key: None,
        };
        root.insert("store".into(), Value::Table(Table::try_from(fresh)?));
    }
    Ok(())
}

/// Where a lower-case name points: a top-level key (`None`), or a key of a section. A top-level
/// key wins over a section prefix (`store_timeout_ms` is not `timeout_ms` of `[store]`).
fn locate(root: &Table, name: &str) -> Option<(Option<String>, String)> {
    let known = |table: &Table, path: &[&str], key: &str| {
        table.get(key).is_some_and(|v| !v.is_table()) || field_names(root, path).contains(&key)
    };
    if known(root, &[], name) {
        return Some((None, name.to_string()));
    }
    root.iter().filter_map(|(section, v)| Some((section, v.as_table()?))).find_map(|(section, table)| {
        let key = name.strip_prefix(section.as_str())?.strip_prefix('_')?;
        known(table, &[section.as_str()], key).then(|| (Some(section.clone()), key.to_string()))
    })
}

/// The value to set for an environment variable: typed like the key's current value (strictly);
/// text for a key that has none (an unset optional key).
fn typed_value(current: Option<&Value>, text: &str) -> Result<Value, &'static str> {
    match current {
        Some(Value::Integer(_)) => text.parse().map(Value::Integer).map_err(|_| "expected an integer"),
        Some(Value::Boolean(_)) => match text {
            "true" => Ok(Value::Boolean(true)),
            "false" => Ok(Value::Boolean(false)),
            _ => Err("expected true or false"),
        },
        Some(Value::Float(_)) => text.parse().map(Value::Float).map_err(|_| "expected a number"),
        Some(Value::String(_)) | None => Ok(Value::String(text.to_string())),
        Some(Value::Array(_) | Value::Table(_) | Value::Datetime(_)) => {
            Err("a list, table or date: set it in the configuration file")
        }
    }
}

/// The keys a `deny_unknown_fields` table of the configuration at `path` accepts (including
/// optional keys left out when serialized), learned from the serde structure: a probe document
/// with one unknown key is deserialized and the "unknown field" error lists the expected ones.
/// The probe carries the table's current text values, so a tagged enum (`store`, by `kind`)
/// answers for its current variant. Empty when the table accepts any key.
fn field_names(root: &Table, path: &[&str]) -> &'static [&'static str] {
    let mut entries = Vec::new();
    if let Some(table) = path.iter().try_fold(root, |t, key| t.get(*key)?.as_table()) {
        for (key, value) in table {
            if let Value::String(text) = value {
                entries.push((key.clone(), Probe::Text(text.clone())));
            }
        }
    }
    entries.push(("\u{0}probe".to_string(), Probe::Text(String::new())));
    let mut probe = Probe::Map(entries);
    for key in path.iter().rev() {
        probe = Probe::Map(vec![(key.to_string(), probe)]);
    }
    expected_fields::<Config>(probe)
}

fn expected_fields<T: DeserializeOwned>(probe: Probe) -> &'static [&'static str] {
    match T::deserialize(probe) {
        Err(Fields(Some(expected))) => expected,
        _ => &[],
    }
}

/// A probe document: a map or text.
enum Probe {
    Map(Vec<(String, Probe)>),
    Text(String),
}

/// The probe's error: the expected fields of an "unknown field" error, nothing for any other.
#[derive(Debug)]
struct Fields(Option<&'static [&'static str]>);

impl fmt::Display for Fields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "probe: {:?}", self.0)
    }
}

impl std::error::Error for Fields {}

impl serde::de::Error for Fields {
    fn custom<T: fmt::Display>(_msg: T) -> Self {
        Fields(None)
    }

    fn unknown_field(_field: &str, expected: &'static [&'static str]) -> Self {
        Fields(Some(expected))
    }
}

impl<'de> IntoDeserializer<'de, Fields> for Probe {
    type Deserializer = Probe;

    fn into_deserializer(self) -> Probe {
        self
    }
}

impl<'de> Deserializer<'de> for Probe {
    type Error = Fields;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Fields> {
        match self {
            Probe::Map(entries) => visitor.visit_map(MapDeserializer::new(entries.into_iter())),
            Probe::Text(text) => visitor.visit_string(text),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Fields> {
        visitor.visit_some(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Fields> {
        match self {
            Probe::Text(text) => visitor.visit_enum(text.into_deserializer()),
            map => map.deserialize_any(visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct newtype_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

#[cfg(test)]
mod tests;
