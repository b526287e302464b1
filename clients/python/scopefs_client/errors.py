"""Exceptions: one class per error code the scopefs API answers, grouped by HTTP status.

An error answer is ``{"error": {"code": "...", "message": "...", ...}}``. :func:`error_from_answer`
turns it into the class registered for its code (``FileExists`` for ``file_exists``), carrying the
HTTP status, the code, the message and the error object's other keys (``details``). A code this
client does not know becomes a plain :class:`ScopefsError`; a non-JSON error body too (its text is
never kept: it could be anything).

A request that reaches no daemon raises :class:`ScopefsConnectionError`; on a ``/tools/*`` route
(the execution side, seed 003 §4.7) it raises :class:`ComputeUnreachable`, which is both a
connection error and a :class:`ComputeUnavailable` — the daemon's own 503 ``compute_unavailable``.
Nothing here holds a token, a secret, a request body or a file's content.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Mapping, Optional

#: Error code -> exception class, filled as the classes below are defined.
CODE_CLASSES: dict[str, type["ScopefsError"]] = {}


class ScopefsError(Exception):
    """Any failure of a scopefs call; the base of every class here (and the class of unknown codes)."""

    #: The API error code this class stands for (``None``: a family or the base).
    code_name: ClassVar[Optional[str]] = None

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        details: Optional[Mapping[str, Any]] = None,
        method: Optional[str] = None,
        route: Optional[str] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(message)
        #: The HTTP status (``None`` when no answer arrived).
        self.status = status
        #: The API error code (``None`` when no error body was answered).
        self.code = code if code is not None else self.code_name
        self.message = message
        #: The error object's keys other than ``code`` and ``message``.
        self.details: dict[str, Any] = dict(details or {})
        self.method = method
        #: The route's path, without its query.
        self.route = route
        #: Seconds the answer's ``Retry-After`` asked for, if any.
        self.retry_after = retry_after

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("code_name")
        if code is not None:
            if code in CODE_CLASSES:
                raise TypeError(f"two exception classes for code {code!r}")
            CODE_CLASSES[code] = cls

    def __str__(self) -> str:
        where = f" on {self.method} {self.route}" if self.method and self.route else ""
        status = f"HTTP {self.status}" if self.status is not None else "no answer"
        return f"{self.code or 'error'} ({status}){where}: {self.message}"


class ScopefsConnectionError(ScopefsError):
    """No answer: the daemon could not be reached, or the connection broke before its answer."""


# --- families, by HTTP status ---------------------------------------------------------------------


class BadRequestError(ScopefsError):
    """400: the request is malformed."""


class AuthenticationError(ScopefsError):
    """401: a token or signature is missing, wrong, expired or replayed."""


class PaymentRequiredError(ScopefsError):
    """402: the account cannot pay for this."""


class PermissionDeniedError(ScopefsError):
    """403: authenticated, but not allowed."""


class NotFoundError(ScopefsError):
    """404: no such resource (or one the caller may not know about)."""


class ConflictError(ScopefsError):
    """409: the request conflicts with the resource's current state."""


class PayloadTooLargeError(ScopefsError):
    """413: content over a size limit."""


class UnprocessableError(ScopefsError):
    """422: a listing past its bounds."""


class TooManyRequestsError(ScopefsError):
    """429: a quota or concurrency bound."""


class ServerError(ScopefsError):
    """500: the daemon failed (its log has the detail)."""


class UnavailableError(ScopefsError):
    """503: temporarily unavailable."""


class InsufficientStorageError(ScopefsError):
    """507: a storage quota or the disk is full."""


# --- one class per code ---------------------------------------------------------------------------
# 400


class InvalidScopeId(BadRequestError):
    code_name = "invalid_scope_id"


class InvalidThreadId(BadRequestError):
    code_name = "invalid_thread_id"


class InvalidJson(BadRequestError):
    code_name = "invalid_json"


class InvalidPath(BadRequestError):
    code_name = "invalid_path"


class InvalidQuery(BadRequestError):
    code_name = "invalid_query"


class InvalidMultipart(BadRequestError):
    code_name = "invalid_multipart"


class InvalidRequest(BadRequestError):
    code_name = "invalid_request"


class InvalidOperationId(BadRequestError):
    code_name = "invalid_operation_id"


class InvalidUserId(BadRequestError):
    code_name = "invalid_user_id"


class InvalidLimit(BadRequestError):
    code_name = "invalid_limit"


class InvalidBody(BadRequestError):
    code_name = "invalid_body"


class InvalidPattern(BadRequestError):
    code_name = "invalid_pattern"


class InvalidBase64(BadRequestError):
    code_name = "invalid_base64"


class Sha256Mismatch(BadRequestError):
    code_name = "sha256_mismatch"


class SnapshotReadOnly(BadRequestError):
    code_name = "snapshot_read_only"


class NoFiles(BadRequestError):
    code_name = "no_files"


class UnknownPlan(BadRequestError):
    code_name = "unknown_plan"


class AmountOutOfRange(BadRequestError):
    code_name = "amount_out_of_range"


class InvalidForm(BadRequestError):
    """The admin web page refused a form body (a 400, or 413/415/422 for its size and type)."""

    code_name = "invalid_form"


# 401 (``invalid_auth_context`` is a 400 when only ``object_scope`` is malformed)


class Unauthorized(AuthenticationError):
    code_name = "unauthorized"


class InvalidAuthContext(AuthenticationError):
    code_name = "invalid_auth_context"


class InvalidSignature(AuthenticationError):
    code_name = "invalid_signature"


class SignatureExpired(AuthenticationError):
    code_name = "signature_expired"


class NonceReplayed(AuthenticationError):
    code_name = "nonce_replayed"


# 402


class InsufficientComputeBalance(PaymentRequiredError):
    code_name = "insufficient_compute_balance"


# 403


class ObjectScopeDenied(PermissionDeniedError):
    code_name = "object_scope_denied"


class NotPermitted(PermissionDeniedError):
    code_name = "not_permitted"


class ReadOnly(PermissionDeniedError):
    code_name = "read_only"


class NotOwner(PermissionDeniedError):
    code_name = "not_owner"


class ImageNotAllowed(PermissionDeniedError):
    code_name = "image_not_allowed"


class CsrfRefused(PermissionDeniedError):
    """The admin web page refused a form that did not come from it."""

    code_name = "csrf_refused"


# 404


class NotFound(NotFoundError):
    """No such route, or (``/api/workspace*``) no such file or workspace — deliberately alike."""

    code_name = "not_found"


class ScopeNotFound(NotFoundError):
    code_name = "scope_not_found"


class FileNotFound(NotFoundError):
    code_name = "file_not_found"


class OwnerNotFound(NotFoundError):
    code_name = "owner_not_found"


class RunRequestNotFound(NotFoundError):
    code_name = "run_request_not_found"


class NodeNotFound(NotFoundError):
    code_name = "node_not_found"


class EnvironmentNotFound(NotFoundError):
    code_name = "environment_not_found"


class ProcessNotFound(NotFoundError):
    code_name = "process_not_found"


class UsageNotFound(NotFoundError):
    code_name = "usage_not_found"


class AccountNotFound(NotFoundError):
    code_name = "account_not_found"


class LegacyUnavailable(NotFoundError):
    code_name = "legacy_unavailable"


# 405, 408


class MethodNotAllowed(ScopefsError):
    code_name = "method_not_allowed"


class BodyTimeout(ScopefsError):
    code_name = "body_timeout"


# 409


class FileExists(ConflictError):
    code_name = "file_exists"


class NotADirectory(ConflictError):
    code_name = "not_a_directory"


class IsADirectory(ConflictError):
    code_name = "is_a_directory"


class DirectoryNotEmpty(ConflictError):
    code_name = "directory_not_empty"


class FileChanged(ConflictError):
    code_name = "file_changed"


class ScopeDeleting(ConflictError):
    code_name = "scope_deleting"


class ScopeDeleted(ConflictError):
    code_name = "scope_deleted"


class ScopeProvisioning(ConflictError):
    code_name = "scope_provisioning"


class ScopeNotMountable(ConflictError):
    code_name = "scope_not_mountable"


class RevisionConflict(ConflictError):
    code_name = "revision_conflict"


class InvalidStateTransition(ConflictError):
    code_name = "invalid_state_transition"


class ThreadAlreadyBound(ConflictError):
    code_name = "thread_already_bound"


class IdempotencyKeyConflict(ConflictError):
    code_name = "idempotency_key_conflict"


class ResourceAlreadyOwned(ConflictError):
    code_name = "resource_already_owned"


class ResourceIdAlreadySet(ConflictError):
    code_name = "resource_id_already_set"


class AmbiguousResource(ConflictError):
    code_name = "ambiguous_resource"


class InterruptAlreadyResolved(ConflictError):
    code_name = "interrupt_already_resolved"


class LeaseHeld(ConflictError):
    code_name = "lease_held"


class LeaseNotHeld(ConflictError):
    code_name = "lease_not_held"


class NodeConflict(ConflictError):
    code_name = "node_conflict"


class MigrationRequired(ConflictError):
    code_name = "migration-required"


class EnvironmentNotRunning(ConflictError):
    code_name = "environment_not_running"


class ArtifactsPending(ConflictError):
    code_name = "artifacts_pending"


class NotUtf8(ConflictError):
    code_name = "not_utf8"


class OldStringNotFound(ConflictError):
    code_name = "old_string_not_found"


class OldStringNotUnique(ConflictError):
    code_name = "old_string_not_unique"


# 413, 416, 422


class TooLarge(PayloadTooLargeError):
    code_name = "too_large"


class RangeNotSatisfiable(ScopefsError):
    code_name = "range_not_satisfiable"


class TooManyEntries(UnprocessableError):
    code_name = "too_many_entries"


class ListingTooLarge(UnprocessableError):
    code_name = "listing_too_large"


# 429 (``scope_busy`` is a 409 when an environment of the scope holds it)


class ScopeBusy(TooManyRequestsError):
    code_name = "scope_busy"


class ComputeCapacityExceeded(TooManyRequestsError):
    code_name = "compute_capacity_exceeded"


class ComputeQuotaExceeded(TooManyRequestsError):
    code_name = "compute_quota_exceeded"


class AdminSessionsFull(TooManyRequestsError):
    """The admin web page has as many sessions as it keeps."""

    code_name = "admin_sessions_full"


# 500


class RegistryError(ServerError):
    code_name = "registry_error"


class MountFailed(ServerError):
    code_name = "mount_failed"


class EngineError(ServerError):
    code_name = "engine_error"


class ExecutorError(ServerError):
    code_name = "executor_error"


class RuntimeAreaError(ServerError):
    code_name = "runtime_area_error"


class TaskFailed(ServerError):
    code_name = "task_failed"


class ReadFailed(ServerError):
    code_name = "read_failed"


class AnswerNotSerialized(ServerError):
    code_name = "answer_not_serialized"


# 503


class NotReady(UnavailableError):
    code_name = "not_ready"


class Busy(UnavailableError):
    code_name = "busy"


class UserBusy(UnavailableError):
    code_name = "user_busy"


class ScopeUnavailable(UnavailableError):
    code_name = "scope_unavailable"


class ObjectStoreUnavailable(UnavailableError):
    code_name = "object_store_unavailable"


class CutoverInProgress(UnavailableError):
    code_name = "cutover-in-progress"


class ScopeMoving(UnavailableError):
    code_name = "scope_moving"


class RequestTimeout(UnavailableError):
    code_name = "request_timeout"


class ComputeUnavailable(UnavailableError):
    """The execution side cannot run anything now (seed 003 §4.7): nothing ran, here or anywhere."""

    code_name = "compute_unavailable"


class ComputeUnreachable(ComputeUnavailable, ScopefsConnectionError):
    """A ``/tools/*`` call that reached no daemon: compute is unavailable, and nothing runs locally."""


# 507


class NoSpace(InsufficientStorageError):
    code_name = "no_space"


class QuotaExceeded(InsufficientStorageError):
    code_name = "quota_exceeded"


class ArtifactLimit(InsufficientStorageError):
    code_name = "artifact_limit"


def _retry_after(headers: Mapping[str, str]) -> Optional[float]:
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None


def error_from_answer(status: int, body: bytes, headers: Mapping[str, str], *, method: str, route: str) -> ScopefsError:
    """The exception for an error answer: the class of its code, or :class:`ScopefsError`."""
    where: dict[str, Any] = {"status": status, "method": method, "route": route, "retry_after": _retry_after(headers)}
    try:
        parsed = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("code"), str):
        return ScopefsError(f"HTTP {status} without a scopefs error body", **where)
    code = error["code"]
    message = error.get("message")
    details = {k: v for k, v in error.items() if k not in ("code", "message")}
    cls = CODE_CLASSES.get(code, ScopefsError)
    return cls(message if isinstance(message, str) else "", code=code, details=details, **where)
