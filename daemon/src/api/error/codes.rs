//! `ErrorCode`: every `error.code` the API answers, with the statuses it is answered with (the one
//! list the OpenAPI document's error schemas enumerate).

use serde::Serialize;

/// Declares [`ErrorCode`]: each variant with its wire text and the HTTP statuses it comes with.
macro_rules! error_codes {
    ($($variant:ident => $text:literal: [$($status:literal),+]),+ $(,)?) => {
        /// One `error.code` of an error answer (`{"error": {"code", "message"}}`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ErrorCode { $($variant),+ }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),+];

            /// The code as it appears on the wire.
            pub fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $text),+ }
            }

            /// The HTTP statuses an answer with this code has.
            pub fn statuses(self) -> &'static [u16] {
                match self { $(ErrorCode::$variant => &[$($status),+]),+ }
            }
        }
    };
}

error_codes! {
    // Authentication and request shape.
    Unauthorized => "unauthorized": [401],
    InvalidSignature => "invalid_signature": [401],
    SignatureExpired => "signature_expired": [401],
    NonceReplayed => "nonce_replayed": [401],
    InvalidAuthContext => "invalid_auth_context": [400, 401],
    InvalidJson => "invalid_json": [400, 415],
    InvalidBody => "invalid_body": [400],
    InvalidQuery => "invalid_query": [400],
    InvalidMultipart => "invalid_multipart": [400],
    InvalidRequest => "invalid_request": [400],
    InvalidPath => "invalid_path": [400],
    InvalidPattern => "invalid_pattern": [400],
    InvalidLimit => "invalid_limit": [400],
    InvalidScopeId => "invalid_scope_id": [400],
    InvalidThreadId => "invalid_thread_id": [400],
    InvalidUserId => "invalid_user_id": [400],
    InvalidOperationId => "invalid_operation_id": [400],
    NoFiles => "no_files": [400],
    SnapshotReadOnly => "snapshot_read_only": [400],
    UnknownPlan => "unknown_plan": [400],
    AmountOutOfRange => "amount_out_of_range": [400],
    TooLarge => "too_large": [413],
    BodyTimeout => "body_timeout": [408],
    NotFound => "not_found": [404],
    MethodNotAllowed => "method_not_allowed": [405],
    // The admin page (`/admin/ui`).
    CsrfRefused => "csrf_refused": [403],
    AdminSessionsFull => "admin_sessions_full": [429],
    InvalidForm => "invalid_form": [400, 413, 415, 422],
    // Scopes, owners, runs, leases (the registry).
    ScopeNotFound => "scope_not_found": [404],
    OwnerNotFound => "owner_not_found": [404],
    RunRequestNotFound => "run_request_not_found": [404],
    NodeNotFound => "node_not_found": [404],
    LegacyUnavailable => "legacy_unavailable": [404],
    RevisionConflict => "revision_conflict": [409],
    InvalidStateTransition => "invalid_state_transition": [409],
    ThreadAlreadyBound => "thread_already_bound": [409],
    IdempotencyKeyConflict => "idempotency_key_conflict": [409],
    ScopeDeleting => "scope_deleting": [409],
    ScopeDeleted => "scope_deleted": [409],
    ScopeProvisioning => "scope_provisioning": [409],
    ScopeNotMountable => "scope_not_mountable": [409],
    MigrationRequired => "migration-required": [409],
    ResourceAlreadyOwned => "resource_already_owned": [409],
    ResourceIdAlreadySet => "resource_id_already_set": [409],
    AmbiguousResource => "ambiguous_resource": [409],
    InterruptAlreadyResolved => "interrupt_already_resolved": [409],
    LeaseHeld => "lease_held": [409],
    LeaseNotHeld => "lease_not_held": [409],
    NodeConflict => "node_conflict": [409],
    CutoverInProgress => "cutover-in-progress": [503],
    ScopeMoving => "scope_moving": [503],
    // Files.
    FileNotFound => "file_not_found": [404],
    FileExists => "file_exists": [409],
    NotADirectory => "not_a_directory": [409],
    IsADirectory => "is_a_directory": [409],
    DirectoryNotEmpty => "directory_not_empty": [409],
    FileChanged => "file_changed": [409],
    OldStringNotFound => "old_string_not_found": [409],
    OldStringNotUnique => "old_string_not_unique": [409],
    NotUtf8 => "not_utf8": [409],
    InvalidBase64 => "invalid_base64": [400],
    Sha256Mismatch => "sha256_mismatch": [400],
    TooManyEntries => "too_many_entries": [422],
    ListingTooLarge => "listing_too_large": [422],
    RangeNotSatisfiable => "range_not_satisfiable": [416],
    NotPermitted => "not_permitted": [403],
    ObjectScopeDenied => "object_scope_denied": [403],
    NoSpace => "no_space": [507],
    QuotaExceeded => "quota_exceeded": [507],
    // Compute.
    EnvironmentNotFound => "environment_not_found": [404],
    ProcessNotFound => "process_not_found": [404],
    EnvironmentNotRunning => "environment_not_running": [409],
    ComputeCapacityExceeded => "compute_capacity_exceeded": [429],
    ComputeUnavailable => "compute_unavailable": [503],
    ImageNotAllowed => "image_not_allowed": [403],
    ReadOnly => "read_only": [403],
    NotOwner => "not_owner": [403],
    ArtifactLimit => "artifact_limit": [507],
    // Billing.
    ComputeQuotaExceeded => "compute_quota_exceeded": [429],
    InsufficientComputeBalance => "insufficient_compute_balance": [402],
    ArtifactsPending => "artifacts_pending": [409],
    UsageNotFound => "usage_not_found": [404],
    AccountNotFound => "account_not_found": [404],
    // Load and availability.
    Busy => "busy": [503],
    ScopeBusy => "scope_busy": [409, 429],
    UserBusy => "user_busy": [429],
    NotReady => "not_ready": [503],
    RequestTimeout => "request_timeout": [503],
    ScopeUnavailable => "scope_unavailable": [503],
    ObjectStoreUnavailable => "object_store_unavailable": [503],
    // Internal failures (details only in the log).
    TaskFailed => "task_failed": [500],
    EngineError => "engine_error": [500],
    RegistryError => "registry_error": [500],
    MountFailed => "mount_failed": [500],
    ReadFailed => "read_failed": [500],
    ExecutorError => "executor_error": [500],
    RuntimeAreaError => "runtime_area_error": [500],
    AnswerNotSerialized => "answer_not_serialized": [500],
}

impl ErrorCode {
    /// The code of `text`, if it is one.
    pub fn of(text: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.as_str() == text)
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl schemars::JsonSchema for ErrorCode {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ErrorCode".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        schemars::json_schema!({ "type": "string", "enum": codes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code literal the API's sources answer with is one of [`ErrorCode::ALL`], with the
    /// status it is answered with: a new code cannot reach the wire without reaching the document.
    #[test]
    fn every_code_in_the_sources_is_declared_with_its_status() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![root];
        let mut found = 0;
        while let Some(p) = files.pop() {
            if p.is_dir() {
                files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            if p.ends_with("api/error/codes.rs") {
                continue; // this scan's own patterns
            }
            let text = std::fs::read_to_string(&p).unwrap();
            for (status, code) in literals(&text) {
                let declared = ErrorCode::of(&code).unwrap_or_else(|| panic!("{code} ({p:?}) is not an ErrorCode"));
                if let Some(status) = status {
                    assert!(declared.statuses().contains(&status), "{code} is answered {status} in {p:?}");
                }
                found += 1;
            }
        }
        assert!(found > 80, "the scan found the codes ({found})");
    }

    /// `(status, code)` of every `StatusCode::X, "code"`, `internal("code"`, and the code helpers'
    /// literals (`Forbidden("code"`, `bad("code"`, `conflict("code"`, `=> "code"` in error.rs).
    fn literals(text: &str) -> Vec<(Option<u16>, String)> {
        let status = |name: &str| -> Option<u16> {
            let s = match name {
                "BAD_REQUEST" => 400,
                "UNAUTHORIZED" => 401,
                "PAYMENT_REQUIRED" => 402,
                "FORBIDDEN" => 403,
                "NOT_FOUND" => 404,
                "METHOD_NOT_ALLOWED" => 405,
                "REQUEST_TIMEOUT" => 408,
                "CONFLICT" => 409,
                "PAYLOAD_TOO_LARGE" => 413,
                "UNSUPPORTED_MEDIA_TYPE" => 415,
                "RANGE_NOT_SATISFIABLE" => 416,
                "UNPROCESSABLE_ENTITY" => 422,
                "TOO_MANY_REQUESTS" => 429,
                "INTERNAL_SERVER_ERROR" => 500,
                "SERVICE_UNAVAILABLE" => 503,
                "INSUFFICIENT_STORAGE" => 507,
                _ => return None,
            };
            Some(s)
        };
        let mut out = Vec::new();
        let compact: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let text = compact.as_str();
        let is_code = |c: &str| !c.is_empty() && c.chars().all(|c| c.is_ascii_lowercase() || c == '_' || c == '-');
        for (i, _) in text.match_indices("StatusCode::") {
            let rest = &text[i + "StatusCode::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_uppercase() || *c == '_').collect();
            if let Some(code) =
                rest[name.len()..].strip_prefix(", \"").and_then(|r| r.split('"').next()).filter(|c| is_code(c))
            {
                out.push((status(&name), code.to_string()));
            }
        }
        for prefix in
            ["internal(\"", "Forbidden( \"", "Forbidden(\"", "bad(\"", "bad( \"", "conflict(\"", "conflict( \""]
        {
            for (i, _) in text.match_indices(prefix) {
                if let Some(code) = text[i + prefix.len()..].split('"').next().filter(|c| is_code(c)) {
                    let status = match prefix {
                        "internal(\"" => Some(500),
                        "conflict(\"" | "conflict( \"" => Some(409),
                        "bad(\"" | "bad( \"" => Some(400),
                        _ => Some(403),
                    };
                    out.push((status, code.to_string()));
                }
            }
        }
        out
    }
}
