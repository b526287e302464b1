//! One conformance suite for every `ObjectStore` backend (memory, local directory, S3 on Garage),
//! plus the S3 error mapping for wrong credentials and an unreachable endpoint.
//!
//! The Garage tests need the `SCOPEFS_TEST_S3_*` environment that `scripts/test.sh`
//! sets after `scripts/garage.sh start`; without it they fail (never skip).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use scopefs::store::{probe, LocalDirStore, MemoryStore, ObjectInfo, ObjectStore, S3Settings, S3Store, StoreError};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

fn random_body(len: usize) -> Bytes {
    let mut body = vec![0u8; len];
    rand::fill(&mut body[..]);
    Bytes::from(body)
}

/// A namespace no other test run uses, so runs against a shared bucket never collide.
fn unique_ns(label: &str) -> String {
    format!("conformance/{label}-{}/", uuid::Uuid::now_v7())
}

fn keys(list: &[ObjectInfo]) -> Vec<&str> {
    list.iter().map(|o| o.key.as_str()).collect()
}

/// Behaviour every backend must share. `ns` is a fresh key namespace ending in `/`.
async fn conformance(store: &dyn ObjectStore, ns: &str) {
    // 5 MiB round trip, byte for byte.
    let big_key = format!("{ns}blocks/big");
    let big = random_body(5 * 1024 * 1024);
    store.put(&big_key, big.clone()).await.expect("put 5 MiB");
    let back = store.get(&big_key).await.expect("get 5 MiB");
    assert_eq!(back.len(), big.len(), "{}: size after round trip", store.describe());
    assert!(back == big, "{}: bytes differ after round trip", store.describe());
    assert_eq!(store.head(&big_key).await.expect("head"), Some(big.len() as u64));

    // `put_hashed` with the bytes' own hash stores them like `put`.
    let hashed_key = format!("{ns}blocks/hashed");
    let hashed = random_body(1024 * 1024 + 7);
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&hashed));
    store.put_hashed(&hashed_key, hashed.clone(), &sha).await.expect("put_hashed");
    assert!(store.get(&hashed_key).await.expect("get of put_hashed") == hashed, "{}: put_hashed", store.describe());
    store.delete(&hashed_key).await.expect("delete of put_hashed");

    // Overwrite replaces the whole object.
    store.put(&big_key, Bytes::from_static(b"short")).await.expect("overwrite");
    assert_eq!(store.get(&big_key).await.expect("get after overwrite"), Bytes::from_static(b"short"));
    assert_eq!(store.head(&big_key).await.expect("head after overwrite"), Some(5));

    // Missing objects.
    let missing = format!("{ns}blocks/missing");
    assert_eq!(store.head(&missing).await.expect("head of missing"), None);
    match store.get(&missing).await {
        Err(StoreError::NotFound { key }) => assert_eq!(key, missing),
        other => panic!("{}: get of a missing key gave {other:?}", store.describe()),
    }

    // A store that answers reads on the calling thread answers what `get` does: a small object
    // (packed in a local directory), a large one, a missing one. Only a local one does.
    let small_key = format!("{ns}blocks/small");
    store.put(&small_key, Bytes::from_static(b"small")).await.expect("put small");
    match store.get_now(&small_key) {
        Some(now) => {
            assert!(store.reads_are_local(), "{}: get_now from a remote store", store.describe());
            assert_eq!(now.expect("get_now small"), Bytes::from_static(b"small"));
            assert_eq!(store.get_now(&big_key).expect("answered").expect("get_now big"), Bytes::from_static(b"short"));
            match store.get_now(&missing).expect("answered") {
                Err(StoreError::NotFound { key }) => assert_eq!(key, missing),
                other => panic!("{}: get_now of a missing key gave {other:?}", store.describe()),
            }
            // Parts of a packed and of a file object, in place; past the end and missing fail.
            let mut part = [0u8; 3];
            store.read_at_now(&small_key, 1, &mut part).expect("answered").expect("part of small");
            assert_eq!(&part, b"mal");
            let file_key = format!("{ns}blocks/file");
            store.put(&file_key, big.clone()).await.expect("put big again");
            let mut part = vec![0u8; 4096];
            store.read_at_now(&file_key, 1 << 20, &mut part).expect("answered").expect("part of big");
            assert_eq!(part, big[1 << 20..(1 << 20) + 4096]);
            assert!(store.read_at_now(&small_key, 4, &mut [0u8; 3]).expect("answered").is_err());
            assert!(store.read_at_now(&file_key, big.len() as u64 - 1, &mut [0u8; 2]).expect("answered").is_err());
            assert!(matches!(
                store.read_at_now(&missing, 0, &mut [0u8; 1]).expect("answered"),
                Err(StoreError::NotFound { .. })
            ));
            store.delete(&file_key).await.expect("delete file");
        }
        None => {
            assert!(!store.reads_are_local(), "{}: a local store that never answers get_now", store.describe());
            assert!(store.read_at_now(&small_key, 0, &mut [0u8; 1]).is_none());
        }
    }
    store.delete(&small_key).await.expect("delete small");

    // Listing by prefix: exact keys and sizes, nothing outside the prefix,
    // and a prefix that is not a whole path component.
    for (name, len) in [("a/1", 1usize), ("a/2", 22), ("ab/3", 333), ("b/4", 0)] {
        store.put(&format!("{ns}{name}"), random_body(len)).await.expect("put small");
    }
    let listed = store.list(&format!("{ns}a/")).await.expect("list a/");
    assert_eq!(
        listed,
        vec![ObjectInfo { key: format!("{ns}a/1"), size: 1 }, ObjectInfo { key: format!("{ns}a/2"), size: 22 },],
        "{}: list of {ns}a/",
        store.describe()
    );
    let listed = store.list(&format!("{ns}a")).await.expect("list a");
    assert_eq!(keys(&listed), vec![format!("{ns}a/1"), format!("{ns}a/2"), format!("{ns}ab/3")]);
    let all = store.list(ns).await.expect("list ns");
    assert_eq!(all.len(), 5, "{}: everything under the namespace: {:?}", store.describe(), keys(&all));
    assert!(store.list(&format!("{ns}nothing/")).await.expect("empty list").is_empty());

    // Delete is idempotent and takes effect.
    let victim = format!("{ns}a/1");
    store.delete(&victim).await.expect("delete");
    store.delete(&victim).await.expect("second delete of the same key");
    store.delete(&format!("{ns}never/existed")).await.expect("delete of a key never written");
    assert!(matches!(store.get(&victim).await, Err(StoreError::NotFound { .. })));
    assert_eq!(store.head(&victim).await.expect("head after delete"), None);
    assert_eq!(keys(&store.list(&format!("{ns}a/")).await.expect("list after delete")), vec![format!("{ns}a/2")]);

    // The startup probe passes and leaves nothing behind in our namespace.
    probe(store).await.expect("probe");

    // Clean up and check the namespace is empty.
    for info in store.list(ns).await.expect("list for cleanup") {
        store.delete(&info.key).await.expect("cleanup delete");
    }
    assert!(store.list(ns).await.expect("list after cleanup").is_empty());
}

#[test]
fn memory_store_conforms() {
    let store = MemoryStore::new();
    runtime().block_on(conformance(&store, &unique_ns("memory")));
}

#[test]
fn local_dir_store_conforms() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = LocalDirStore::new(dir.path().join("objects")).expect("local store");
    runtime().block_on(conformance(&store, &unique_ns("local")));
}

fn required_env(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{name} is not set: the Garage tests need a running Garage server; \
             run them through scripts/test.sh (or `eval \"$(scripts/garage.sh env)\"` after `scripts/garage.sh start`)"
        ),
    }
}

fn garage_settings(prefix: &str) -> S3Settings {
    S3Settings {
        endpoint: Some(required_env("SCOPEFS_TEST_S3_ENDPOINT")),
        region: required_env("SCOPEFS_TEST_S3_REGION"),
        bucket: required_env("SCOPEFS_TEST_S3_BUCKET"),
        prefix: prefix.to_string(),
        path_style: true,
        access_key_id: Some(required_env("SCOPEFS_TEST_S3_ACCESS_KEY_ID")),
        secret_access_key: Some(required_env("SCOPEFS_TEST_S3_SECRET_ACCESS_KEY")),
    }
}

#[test]
fn s3_store_on_garage_conforms() {
    let store = S3Store::new(garage_settings("")).expect("s3 store");
    let description = store.describe();
    assert!(description.contains(&required_env("SCOPEFS_TEST_S3_BUCKET")), "describe: {description}");
    assert!(!description.contains(&required_env("SCOPEFS_TEST_S3_SECRET_ACCESS_KEY")));
    runtime().block_on(conformance(&store, &unique_ns("s3")));
}

#[test]
fn s3_store_prefix_is_prepended_and_stripped() {
    let prefix = format!("conformance-prefix-{}", uuid::Uuid::now_v7());
    let scoped = S3Store::new(garage_settings(&prefix)).expect("prefixed store");
    let raw = S3Store::new(garage_settings("")).expect("raw store");
    runtime().block_on(async {
        // The whole suite works under a prefix too.
        conformance(&scoped, "ns/").await;
        scoped.put("scopes/x/blocks/k", Bytes::from_static(b"prefixed")).await.expect("put");
        // The raw bucket holds it under the prefix; the prefixed store lists it without.
        let full = format!("{prefix}/scopes/x/blocks/k");
        assert_eq!(raw.get(&full).await.expect("raw get"), Bytes::from_static(b"prefixed"));
        assert_eq!(
            scoped.list("scopes/").await.expect("list"),
            vec![ObjectInfo { key: "scopes/x/blocks/k".into(), size: 8 }]
        );
        scoped.delete("scopes/x/blocks/k").await.expect("delete");
        assert!(raw.list(&format!("{prefix}/")).await.expect("raw list").is_empty());
    });
}

#[test]
fn s3_store_lists_across_pages() {
    // Garage answers ListObjectsV2 with at most 1000 keys per page.
    let store = Arc::new(S3Store::new(garage_settings("")).expect("s3 store"));
    let ns = unique_ns("pages");
    runtime().block_on(async {
        let names: Vec<String> = (0..1005).map(|i| format!("{ns}k{i:05}")).collect();
        for chunk in names.chunks(50) {
            let mut set = tokio::task::JoinSet::new();
            for key in chunk {
                let (store, key) = (store.clone(), key.clone());
                set.spawn(async move { store.put(&key, Bytes::from_static(b"x")).await });
            }
            while let Some(res) = set.join_next().await {
                res.expect("put task").expect("put");
            }
        }
        let listed = store.list(&ns).await.expect("list");
        assert_eq!(keys(&listed), names, "every key, once, in order");
        for info in listed {
            store.delete(&info.key).await.expect("cleanup");
        }
    });
}

/// The hash `put_hashed` signs is checked by the server: bytes that are not the named hash's are
/// refused and never stored (the signature covers the hash, not a copy of the bytes).
#[test]
fn s3_put_hashed_with_a_wrong_hash_is_refused() {
    let store = S3Store::new(garage_settings("")).expect("s3 store");
    let ns = unique_ns("s3-hash");
    let key = format!("{ns}blocks/wrong");
    let body = random_body(64 * 1024);
    let other = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"other bytes"));
    runtime().block_on(async {
        match store.put_hashed(&key, body.clone(), &other).await {
            Err(StoreError::Rejected(_)) => {}
            other => panic!("a wrong payload hash gave {other:?}, want Rejected"),
        }
        assert_eq!(store.head(&key).await.expect("head"), None, "refused bytes were stored");
        let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&body));
        store.put_hashed(&key, body.clone(), &sha).await.expect("the right hash");
        assert!(store.get(&key).await.expect("get") == body);
        store.delete(&key).await.expect("delete");
    });
}

#[test]
fn s3_wrong_credentials_are_rejected() {
    let mut settings = garage_settings("");
    settings.secret_access_key = Some("0".repeat(64));
    let wrong_secret = S3Store::new(settings).expect("store with a wrong secret");
    let mut settings = garage_settings("");
    settings.access_key_id = Some("GK000000000000000000000000".into());
    let unknown_key = S3Store::new(settings).expect("store with an unknown key");
    let secret = required_env("SCOPEFS_TEST_S3_SECRET_ACCESS_KEY");
    runtime().block_on(async {
        for store in [&wrong_secret, &unknown_key] {
            let results = [
                store.put("conformance/denied", Bytes::from_static(b"x")).await.err(),
                store.get("conformance/denied").await.err(),
                store.head("conformance/denied").await.err(),
                store.list("conformance/").await.err(),
                probe(store).await.err(),
            ];
            for err in results {
                match err {
                    Some(StoreError::Rejected(msg)) => {
                        assert!(!msg.contains(&secret), "error message leaks the secret");
                        assert!(!msg.contains(&"0".repeat(64)), "error message leaks the secret");
                    }
                    other => panic!("wrong credentials gave {other:?}, want Rejected"),
                }
            }
        }
    });
}

#[test]
fn s3_unreachable_endpoint_fails_fast() {
    let mut settings = garage_settings("");
    settings.endpoint = Some("http://127.0.0.1:1".into());
    let store = S3Store::new(settings).expect("store");
    runtime().block_on(async {
        let started = Instant::now();
        let put = store.put("conformance/unreachable", Bytes::from_static(b"x")).await;
        let get = store.get("conformance/unreachable").await;
        let list = store.list("conformance/").await;
        let elapsed = started.elapsed();
        for res in [put.err(), get.err(), list.err()] {
            match res {
                Some(e @ (StoreError::Unavailable(_) | StoreError::Timeout(_))) => {
                    assert!(e.is_transient())
                }
                other => panic!("unreachable endpoint gave {other:?}, want Unavailable or Timeout"),
            }
        }
        assert!(elapsed < Duration::from_secs(15), "three calls to a closed port took {elapsed:?}");
    });
}

#[test]
fn s3_missing_credentials_are_a_config_error() {
    let mut settings = garage_settings("");
    settings.access_key_id = Some("GK000000000000000000000000".into());
    settings.secret_access_key = None;
    assert!(matches!(S3Store::new(settings), Err(StoreError::Config(_))));
}
