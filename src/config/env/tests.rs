//! Tests of the `SCOPEFS_*` environment overlay.

use toml::{Table, Value};

use super::*;
use crate::config::Config;

fn load(env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::load(None, env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

/// Every scalar key of the default configuration, as (section, key, value); nested tables
/// below a section (`pricing.plans`) are file-only.
fn default_keys() -> Vec<(Option<String>, String, Value)> {
    let root = Table::try_from(Config::default()).unwrap();
    let mut keys = Vec::new();
    for (key, value) in &root {
        match value {
            Value::Table(section) => {
                for (k, v) in section.iter().filter(|(_, v)| !v.is_table()) {
                    keys.push((Some(key.clone()), k.clone(), v.clone()));
                }
            }
            v => keys.push((None, key.clone(), v.clone())),
        }
    }
    keys
}

/// A different value of the same type (or the same text, for strings that name choices).
fn other(value: &Value) -> String {
    match value {
        Value::Integer(n) => (n + 1).to_string(),
        Value::Boolean(b) => (!b).to_string(),
        Value::String(s) => s.clone(),
        other => panic!("a default key of type {other:?}: give it an environment form"),
    }
}

#[test]
fn every_key_of_the_default_configuration_has_a_round_tripping_override() {
    let keys = default_keys();
    assert!(keys.len() > 60, "the default configuration has fewer keys than expected: {}", keys.len());
    for (section, key, value) in keys {
        let var = match &section {
            None => format!("SCOPEFS_{}", key.to_ascii_uppercase()),
            Some(s) => format!("SCOPEFS_{}_{}", s.to_ascii_uppercase(), key.to_ascii_uppercase()),
        };
        let text = other(&value);
        let mut cfg = Config::default();
        apply(&mut cfg, &var, &text).unwrap_or_else(|e| panic!("{var}={text}: {e}"));
        let root = Table::try_from(&cfg).unwrap();
        let table = match &section {
            None => &root,
            Some(s) => root[s].as_table().unwrap(),
        };
        let got = match &table[&key] {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        assert_eq!(got, text, "{var}");
    }
}

#[test]
fn keys_the_review_found_missing_are_covered() {
    let cfg = load(&[
        ("SCOPEFS_BLOCK_SIZE", "1048576"),
        ("SCOPEFS_UPLOAD_PARALLELISM", "3"),
        ("SCOPEFS_STORE_ATTEMPTS", "5"),
        ("SCOPEFS_STORE_TIMEOUT_MS", "1234"),
        ("SCOPEFS_READAHEAD_BLOCKS", "7"),
        ("SCOPEFS_FUSE_THREADS", "3"),
        ("SCOPEFS_FUSE_ALLOW_OTHER", "false"),
        ("SCOPEFS_FUSE_WRITEBACK_CACHE", "true"),
        ("SCOPEFS_FUSE_MAX_WRITE_KIB", "128"),
        ("SCOPEFS_ATTR_TTL_MS", "5"),
        ("SCOPEFS_LIMITS_MAX_INFLIGHT_PER_SCOPE", "3"),
    ])
    .unwrap();
    assert_eq!((cfg.block_size, cfg.upload_parallelism, cfg.store_attempts), (1 << 20, 3, 5));
    assert_eq!((cfg.store_timeout_ms, cfg.readahead_blocks), (1234, 7));
    assert_eq!((cfg.fuse.threads, cfg.fuse.allow_other, cfg.fuse.writeback_cache), (3, false, true));
    assert_eq!((cfg.fuse.max_write_kib, cfg.fuse.attr_ttl_ms), (128, 5));
    assert_eq!(cfg.limits.max_inflight_per_scope, 3);
}

#[test]
fn optional_keys_and_the_s3_store_are_covered() {
    let cfg = load(&[
        ("SCOPEFS_SERVICE_TOKEN", "s"),
        ("SCOPEFS_ADMIN_TOKEN", "a"),
        ("SCOPEFS_LEGACY_ROOT", "/srv/legacy"),
        ("SCOPEFS_S3_ENDPOINT", "http://127.0.0.1:3900"),
        ("SCOPEFS_S3_BUCKET", "b"),
        ("SCOPEFS_S3_PATH_STYLE", "false"),
        ("SCOPEFS_S3_SECRET_ACCESS_KEY", "k"),
    ])
    .unwrap();
    assert_eq!((cfg.service_token.as_deref(), cfg.admin_token.as_deref()), (Some("s"), Some("a")));
    assert_eq!(cfg.legacy_root.as_deref(), Some(std::path::Path::new("/srv/legacy")));
    let StoreConfig::S3 { endpoint, region, bucket, path_style, secret_access_key, .. } = cfg.store else {
        panic!("an S3 variable makes the store S3: {:?}", cfg.store)
    };
    assert_eq!(
        (endpoint.as_deref(), region.as_str(), bucket.as_str()),
        (Some("http://127.0.0.1:3900"), "us-east-1", "b")
    );
    assert_eq!((path_style, secret_access_key.as_deref()), (false, Some("k")));
    let local = load(&[("SCOPEFS_STORE_PATH", "/srv/objects")]).unwrap();
    assert_eq!(local.store, StoreConfig::Local { path: Some("/srv/objects".into()) });
}

#[test]
fn an_unknown_scopefs_name_is_refused_naming_it() {
    for var in ["SCOPEFS_FOO", "SCOPEFS_", "SCOPEFS_FUSE_NO_SUCH", "SCOPEFS_LIMITS_NO_SUCH_BOUND", "SCOPEFS_S3_BUCKETS"]
    {
        let err = load(&[(var, "1")]).unwrap_err();
        assert!(matches!(err, ConfigError::UnknownEnv(ref v) if v == var), "{var}: {err}");
        assert!(err.to_string().contains(var), "{err}");
    }
    // A table is not a scalar: set in the file only.
    let err = load(&[("SCOPEFS_PRICING_PLANS", "x")]).unwrap_err().to_string();
    assert!(err.contains("SCOPEFS_PRICING_PLANS"), "{err}");
}

#[test]
fn values_parse_strictly_naming_the_variable() {
    let cases = [
        ("SCOPEFS_QUOTA_BYTES", "lots"),
        ("SCOPEFS_QUOTA_BYTES", "-1"),
        ("SCOPEFS_FUSE_ALLOW_OTHER", "yes"),
        ("SCOPEFS_FUSE_THREADS", " 4"),
        ("SCOPEFS_DURABILITY", "sometimes"),
        ("SCOPEFS_LIMITS_MAX_PATH_DEPTH", "-1"),
        ("SCOPEFS_EXECUTOR_ISOLATION", "strict"),
    ];
    for (var, value) in cases {
        let err = load(&[(var, value)]).unwrap_err();
        assert!(matches!(err, ConfigError::Env { ref key, .. } if key == var), "{var}={value}: {err}");
    }
    assert_eq!(load(&[("SCOPEFS_DURABILITY", "writeback")]).unwrap().durability, crate::engine::Durability::Fsync);
}

#[test]
fn names_read_elsewhere_are_accepted_and_change_nothing() {
    let names = [
        "SCOPEFS_CONFIG",
        "SCOPEFS_LOG",
        "SCOPEFS_LOG_FORMAT",
        "SCOPEFS_SERVE_ROLE",
        "SCOPEFS_NOTIFY_FD",
        "SCOPEFS_LISTEN_FDNAMES_FD",
        "SCOPEFS_FDSTORE",
        "SCOPEFS_DOCTOR_FUSE_DEVICE",
        "SCOPEFS_TEST_S3_BUCKET",
        "SCOPEFS_TEST_STATE",
        "SCOPEFS_CRASH_ROUNDS",
        "SCOPEFS_BILLING_TEST_CHILD_DB",
        "SCOPEFS_RELEASE_BIN",
        "SCOPEFS_BIN",
        "SCOPEFS_BENCH_FUSE",
    ];
    let hooks = crate::testhooks::ENV_NAMES;
    for var in names.iter().chain(hooks.iter()) {
        assert!(is_non_config_env(var), "{var}");
        assert_eq!(load(&[(var, "whatever")]).unwrap(), Config::default(), "{var}");
    }
    // Not a SCOPEFS_ name: none of the overlay's business.
    assert_eq!(load(&[("PATH", "/bin"), ("SCOPEFSX", "1")]).unwrap(), Config::default());
}
