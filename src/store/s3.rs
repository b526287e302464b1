//! `S3Store`: objects in an S3-compatible bucket through `aws-sdk-s3` (Garage, MinIO, AWS S3).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use aws_runtime::auth::PayloadSigningOverride;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region, RequestChecksumCalculation};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextMut;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use bytes::Bytes;

use super::{ObjectInfo, ObjectStore, StoreError};

/// Bound on establishing a TCP/TLS connection to the endpoint.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on one HTTP attempt (a 4 MiB block over a slow link still fits).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one operation including the SDK's own retry.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(130);
/// The SDK's own attempts per request; the engine adds its timeout/retry layer on top.
const SDK_MAX_ATTEMPTS: u32 = 2;

/// Where and how to reach the bucket. `Debug` never prints the secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Settings {
    /// Endpoint URL (`http://127.0.0.1:3900`); `None` uses the AWS endpoint of `region`.
    pub endpoint: Option<String>,
    pub region: String,
    pub bucket: String,
    /// Prepended to every key (a `/` is added if missing) and stripped from listed keys.
    pub prefix: String,
    /// Path-style addressing (`<endpoint>/<bucket>/<key>`), needed by Garage and MinIO.
    pub path_style: bool,
    /// Static credentials; when absent, `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` are used.
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

impl fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("path_style", &self.path_style)
            .field("access_key_id", &self.access_key_id.as_ref().map(|_| "<set>"))
            .field("secret_access_key", &self.secret_access_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// An S3 bucket (optionally under a key prefix) as an object store.
pub struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
    endpoint_label: String,
}

impl fmt::Debug for S3Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Signs a request with a payload hash the caller already computed (SigV4's
/// `x-amz-content-sha256`), instead of the SDK hashing the body again; the server checks the body
/// against it, so a wrong hash is refused, never stored.
#[derive(Debug)]
struct KnownPayloadHash(String);

impl Intercept for KnownPayloadHash {
    fn name(&self) -> &'static str {
        "scopefs.KnownPayloadHash"
    }

    fn modify_before_signing(
        &self,
        _context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        cfg.interceptor_state().store_put(PayloadSigningOverride::Precomputed(self.0.to_ascii_lowercase()));
        Ok(())
    }
}

/// Picks static credentials from the settings, else from the standard environment variables.
fn credentials(settings: &S3Settings) -> Result<Credentials, StoreError> {
    credentials_with(settings, |name| std::env::var(name).ok())
}

fn credentials_with(settings: &S3Settings, env: impl Fn(&str) -> Option<String>) -> Result<Credentials, StoreError> {
    match (&settings.access_key_id, &settings.secret_access_key) {
        (Some(id), Some(secret)) if !id.is_empty() && !secret.is_empty() => {
            Ok(Credentials::new(id.clone(), secret.clone(), None, None, "scopefs-config"))
        }
        (None, None) => {
            let var = |name: &str| env(name).filter(|v| !v.is_empty());
            match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
                (Some(id), Some(secret)) => {
                    Ok(Credentials::new(id, secret, var("AWS_SESSION_TOKEN"), None, "scopefs-env"))
                }
                _ => Err(StoreError::Config(
                    "s3 credentials missing: set access_key_id and secret_access_key, \
                     or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                        .into(),
                )),
            }
        }
        _ => Err(StoreError::Config("s3 access_key_id and secret_access_key must be set together".into())),
    }
}

impl S3Store {
    /// Builds the client without any network traffic or environment-driven configuration
    /// (only the credential variables are read, and only when the settings carry none).
    pub fn new(settings: S3Settings) -> Result<S3Store, StoreError> {
        if settings.bucket.is_empty() {
            return Err(StoreError::Config("s3 bucket is not set".into()));
        }
        if settings.region.is_empty() {
            return Err(StoreError::Config("s3 region is not set".into()));
        }
        let creds = credentials(&settings)?;
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .operation_attempt_timeout(ATTEMPT_TIMEOUT)
            .operation_timeout(OPERATION_TIMEOUT)
            .build();
        let mut builder = aws_sdk_s3::config::Builder::new()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(settings.region.clone()))
            .credentials_provider(creds)
            .force_path_style(settings.path_style)
            .retry_config(RetryConfig::standard().with_max_attempts(SDK_MAX_ATTEMPTS))
            // Every body is covered by the signature's SHA-256 (the server checks it), so a second
            // checksum (CRC32) is computed only where an operation requires one.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .timeout_config(timeouts);
        let endpoint_label = match &settings.endpoint {
            Some(url) => {
                let url = url.trim_end_matches('/');
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(StoreError::Config("s3 endpoint must start with http:// or https://".into()));
                }
                if url.contains('@') {
                    return Err(StoreError::Config("s3 endpoint must not carry credentials".into()));
                }
                builder = builder.endpoint_url(url);
                url.to_string()
            }
            None => format!("aws region {}", settings.region),
        };
        let mut prefix = settings.prefix.trim_start_matches('/').to_string();
        if !prefix.is_empty() && !prefix.ends_with('/') {
            prefix.push('/');
        }
        Ok(S3Store {
            client: aws_sdk_s3::Client::from_conf(builder.build()),
            bucket: settings.bucket,
            prefix,
            endpoint_label,
        })
    }

    /// One PutObject; signed with `sha256_hex` as the payload's hash when given (else the SDK
    /// hashes the body).
    async fn put_object(&self, key: &str, data: Bytes, sha256_hex: Option<&str>) -> Result<(), StoreError> {
        let full = self.full_key(key)?;
        let put = self.client.put_object().bucket(&self.bucket).key(full).body(ByteStream::from(data)).customize();
        let put = match sha256_hex {
            Some(sha) => put.interceptor(KnownPayloadHash(sha.to_string())),
            None => put,
        };
        put.send().await.map_err(|e| map_sdk_error("put", key, e))?;
        Ok(())
    }

    fn full_key(&self, key: &str) -> Result<String, StoreError> {
        if key.is_empty() {
            return Err(StoreError::Rejected("invalid object key (empty)".into()));
        }
        Ok(format!("{}{key}", self.prefix))
    }
}

/// Maps an SDK failure onto the store's error kinds; the text carries codes and
/// transport causes only, never request headers or credentials.
fn map_sdk_error<E>(op: &str, key: &str, err: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let status = err.raw_response().map(|r| r.status().as_u16());
    let code = err.code().map(str::to_string);
    match &err {
        SdkError::TimeoutError(_) => return StoreError::Timeout(OPERATION_TIMEOUT),
        SdkError::DispatchFailure(failure) => {
            if failure.is_timeout() {
                return StoreError::Timeout(CONNECT_TIMEOUT);
            }
            if failure.is_user() {
                return StoreError::Config(format!("s3 {op} could not be sent: {}", DisplayErrorContext(&err)));
            }
            return StoreError::Unavailable(format!("s3 {op}: {}", DisplayErrorContext(&err)));
        }
        SdkError::ConstructionFailure(_) => {
            return StoreError::Config(format!("s3 {op} could not be built: {}", DisplayErrorContext(&err)))
        }
        _ => {}
    }
    let label = match (&code, status) {
        (Some(code), Some(status)) => format!("{code} (HTTP {status})"),
        (Some(code), None) => code.clone(),
        (None, Some(status)) => format!("HTTP {status}"),
        (None, None) => "no response".to_string(),
    };
    let code = code.as_deref().unwrap_or("");
    if status == Some(404) || matches!(code, "NoSuchKey" | "NotFound") {
        if code == "NoSuchBucket" {
            return StoreError::Config(format!("s3 {op}: bucket does not exist: {label}"));
        }
        return StoreError::NotFound { key: key.to_string() };
    }
    if status == Some(403)
        || matches!(code, "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "AccessDenied" | "Forbidden")
    {
        return StoreError::Rejected(format!("s3 {op} denied: {label}"));
    }
    match status {
        Some(s) if s >= 500 || s == 429 || s == 408 => StoreError::Unavailable(format!("s3 {op}: {label}")),
        Some(_) => StoreError::Rejected(format!("s3 {op} refused: {label}")),
        None => StoreError::Unavailable(format!("s3 {op}: {label}")),
    }
}

#[async_trait]
impl ObjectStore for S3Store {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        self.put_object(key, data, None).await
    }

    async fn put_hashed(&self, key: &str, data: Bytes, sha256_hex: &str) -> Result<(), StoreError> {
        self.put_object(key, data, Some(sha256_hex)).await
    }

    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let full = self.full_key(key)?;
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(full)
            .send()
            .await
            .map_err(|e| map_sdk_error("get", key, e))?;
        let body =
            out.body.collect().await.map_err(|e| {
                StoreError::Unavailable(format!("s3 get: body interrupted: {}", DisplayErrorContext(&e)))
            })?;
        Ok(body.into_bytes())
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let full = self.full_key(key)?;
        match self.client.head_object().bucket(&self.bucket).key(full).send().await {
            Ok(out) => Ok(Some(out.content_length().unwrap_or(0).max(0) as u64)),
            Err(e) => match map_sdk_error("head", key, e) {
                StoreError::NotFound { .. } => Ok(None),
                other => Err(other),
            },
        }
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let full = self.full_key(key)?;
        match self.client.delete_object().bucket(&self.bucket).key(full).send().await {
            Ok(_) => Ok(()),
            Err(e) => match map_sdk_error("delete", key, e) {
                StoreError::NotFound { .. } => Ok(()),
                other => Err(other),
            },
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let full_prefix = format!("{}{prefix}", self.prefix);
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&full_prefix)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| match map_sdk_error("list", prefix, e) {
                    StoreError::NotFound { .. } => StoreError::Config("s3 list: bucket does not exist".into()),
                    other => other,
                })?;
            for obj in page.contents() {
                let Some(key) = obj.key() else { continue };
                let Some(rel) = key.strip_prefix(&self.prefix) else {
                    continue;
                };
                out.push(ObjectInfo { key: rel.to_string(), size: obj.size().unwrap_or(0).max(0) as u64 });
            }
            match page.next_continuation_token() {
                Some(next) if page.is_truncated() == Some(true) => token = Some(next.to_string()),
                _ => break,
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    fn describe(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3 bucket {} at {}", self.bucket, self.endpoint_label)
        } else {
            format!("s3 bucket {} (prefix {}) at {}", self.bucket, self.prefix, self.endpoint_label)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> S3Settings {
        S3Settings {
            endpoint: Some("http://127.0.0.1:3900/".into()),
            region: "garage".into(),
            bucket: "b".into(),
            prefix: "tenant".into(),
            path_style: true,
            access_key_id: Some("GKexample".into()),
            secret_access_key: Some("very-secret-value".into()),
        }
    }

    #[test]
    fn describe_and_debug_hide_secrets() {
        let s = settings();
        assert!(!format!("{s:?}").contains("very-secret-value"));
        let store = S3Store::new(s).unwrap();
        let text = store.describe();
        assert_eq!(text, "s3 bucket b (prefix tenant/) at http://127.0.0.1:3900");
        assert!(!format!("{store:?}").contains("very-secret-value"));
    }

    #[test]
    fn invalid_settings_are_config_errors() {
        let mut s = settings();
        s.bucket.clear();
        assert!(matches!(S3Store::new(s), Err(StoreError::Config(_))));
        let mut s = settings();
        s.endpoint = Some("127.0.0.1:3900".into());
        assert!(matches!(S3Store::new(s), Err(StoreError::Config(_))));
        let mut s = settings();
        s.secret_access_key = None;
        assert!(matches!(S3Store::new(s), Err(StoreError::Config(_))));
    }

    #[test]
    fn prefix_is_normalised() {
        let mut s = settings();
        s.prefix = String::new();
        assert_eq!(S3Store::new(s).unwrap().prefix, "");
        let mut s = settings();
        s.prefix = "/a/b/".into();
        assert_eq!(S3Store::new(s).unwrap().prefix, "a/b/");
    }

    #[test]
    fn credentials_fall_back_to_standard_env_vars() {
        let mut s = settings();
        s.access_key_id = None;
        s.secret_access_key = None;
        let env = |name: &str| match name {
            "AWS_ACCESS_KEY_ID" => Some("GKfromenv".to_string()),
            "AWS_SECRET_ACCESS_KEY" => Some("env-secret".to_string()),
            _ => None,
        };
        let creds = credentials_with(&s, env).unwrap();
        assert_eq!(creds.access_key_id(), "GKfromenv");
        assert_eq!(creds.secret_access_key(), "env-secret");
        assert!(matches!(credentials_with(&s, |_| None), Err(StoreError::Config(_))));
        let only_id = |name: &str| (name == "AWS_ACCESS_KEY_ID").then(|| "GK".to_string());
        assert!(matches!(credentials_with(&s, only_id), Err(StoreError::Config(_))));
        // Settings win over the environment.
        let creds = credentials_with(&settings(), env).unwrap();
        assert_eq!(creds.access_key_id(), "GKexample");
    }
}
