"""The request-building core both clients share: what a call is, how it is authenticated and
signed, when it may be retried, and how its answer is read.

A :class:`Call` describes one route call (method, path, authentication, query, JSON body or
signed tool parameters, whether it is idempotent, how to read the answer). :class:`Core` turns a
call into the parts of an HTTP request — a signed call is signed afresh for every attempt, so a
retry carries a new ``nonce`` and ``issued_at`` — and decides, from an attempt's failure, whether
to try again and after how long (:class:`RetryPolicy`). The sync and async clients only send.

Retries (bounded, exponential backoff with jitter, honouring ``Retry-After``) happen only for calls
marked idempotent: GETs, read-only tool calls, and POSTs the API makes idempotent by a key or by
definition (see each route's wrapper). A call that is not idempotent is sent exactly once.
"""

from __future__ import annotations

import enum
import json
import random
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import IO, Any, AsyncIterable, Iterable, Iterator, Mapping, Optional, Sequence, Union
from urllib.parse import quote

import httpx

from . import errors, signing

#: A streamed request body: bytes, a binary file object, or an iterable of byte chunks (the async
#: client also takes an async iterable).
Source = Union[bytes, IO[bytes], Iterable[bytes], AsyncIterable[bytes]]

#: The JSON object an answer decodes to.
Json = dict[str, Any]

#: Bytes read from a file object at a time when streaming it.
CHUNK = 256 * 1024

#: Most bytes of an error answer read (error bodies are small; anything past this is ignored).
MAX_ERROR_BODY = 64 * 1024


class Auth(enum.Enum):
    """How a route authenticates (the daemon's route table)."""

    PUBLIC = "public"
    SERVICE = "service_token"
    ADMIN = "admin_token"
    SIGNED = "hmac_auth_context"


class Answer(enum.Enum):
    """How a call's answer is read."""

    JSON = "json"
    TEXT = "text"
    EMPTY = "empty"
    READY = "ready"


@dataclass(frozen=True)
class Tool:
    """The signed part of a ``/tools/*`` call."""

    thread_id: str
    params: Mapping[str, Any]
    user_id: Optional[str] = None
    object_scope: Optional[Mapping[str, Any]] = None


@dataclass(frozen=True)
class Call:
    """One route call, as both clients send it."""

    method: str
    #: The route template, e.g. ``/internal/workspace-scopes/{scope_id}/mount`` (for errors).
    route: str
    auth: Auth
    #: The path parameters, filled into ``route`` percent-encoded.
    path_params: Mapping[str, str] = field(default_factory=dict)
    query: Sequence[tuple[str, str]] = ()
    json: Any = None
    tool: Optional[Tool] = None
    idempotent: bool = False
    answer: Answer = Answer.JSON
    #: Seconds for the whole call; ``None``: the client's default.
    timeout: Optional[float] = None

    @property
    def path(self) -> str:
        path = self.route
        for name, value in self.path_params.items():
            path = path.replace("{" + name + "}", quote(str(value), safe=""))
        return path


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff, for idempotent calls only.

    ``attempts`` counts every try (1: never retry). The n-th retry waits ``base_delay * 2**(n-1)``
    scaled by a random factor in [0.5, 1], at most ``max_delay``, and at least what the answer's
    ``Retry-After`` asked for (itself capped by ``max_delay``).
    """

    attempts: int = 4
    base_delay: float = 0.2
    max_delay: float = 5.0
    #: Error codes that say "try again later" (nothing was done).
    retry_codes: frozenset[str] = frozenset(
        {
            "busy",
            "user_busy",
            "not_ready",
            "scope_moving",
            "scope_busy",
            "request_timeout",
            "object_store_unavailable",
            "scope_unavailable",
        }
    )

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("attempts must be >= 1 and delays >= 0")

    def retryable(self, err: errors.ScopefsError) -> bool:
        """Whether a failure says nothing was done and a later try may succeed."""
        if isinstance(err, errors.ScopefsConnectionError):
            return True
        if err.code in self.retry_codes:
            return True
        # A proxy's answer without a scopefs body.
        return err.code is None and err.status in (502, 503, 504)

    def delay(self, retry: int, retry_after: Optional[float]) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        backoff: float = min(self.max_delay, self.base_delay * 2.0 ** (retry - 1)) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            backoff = max(backoff, min(retry_after, self.max_delay))
        return backoff


@dataclass(frozen=True)
class Prepared:
    """The parts of one HTTP request (one attempt)."""

    method: str
    url: str
    headers: dict[str, str]
    params: list[tuple[str, str]]
    json: Any
    timeout: Optional[float]


def build_request(
    http: Union[httpx.Client, httpx.AsyncClient],
    p: Prepared,
    *,
    content: Union[Iterable[bytes], AsyncIterable[bytes], None] = None,
    headers: Optional[Mapping[str, str]] = None,
) -> httpx.Request:
    """The ``httpx.Request`` of one attempt: a streamed ``content`` when given, else ``p``'s JSON."""
    timeout: Any = p.timeout if p.timeout is not None else httpx.USE_CLIENT_DEFAULT
    all_headers = {**p.headers, **(headers or {})}
    params = httpx.QueryParams(tuple(p.params))
    if content is not None:
        return http.build_request(p.method, p.url, params=params, headers=all_headers, content=content, timeout=timeout)
    return http.build_request(p.method, p.url, params=params, headers=all_headers, json=p.json, timeout=timeout)


class Core:
    """What both clients share: credentials, signing, retry decisions and answer reading.

    Credentials are kept here only; nothing in this class logs them or puts them in an exception.
    """

    def __init__(
        self,
        base_url: str,
        *,
        service_token: Optional[str] = None,
        admin_token: Optional[str] = None,
        hmac_secret: Optional[str] = None,
        user_id: Optional[str] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._service_token = service_token
        self._admin_token = admin_token
        self._hmac_secret = hmac_secret
        self.user_id = user_id
        self.retry = retry or RetryPolicy()

    def __repr__(self) -> str:
        return f"Core(base_url={self.base_url!r}, user_id={self.user_id!r})"

    def prepare(self, call: Call) -> Prepared:
        """The request of one attempt of ``call``; a signed call gets a fresh nonce and issued_at."""
        headers: dict[str, str] = {"accept": "application/json"}
        body: Any = call.json
        if call.auth is Auth.SERVICE:
            headers["authorization"] = "Bearer " + self._need(self._service_token, "a service token")
        elif call.auth is Auth.ADMIN:
            headers["x-admin-token"] = self._need(self._admin_token, "an admin token")
        elif call.auth is Auth.SIGNED:
            body = self.sign_tool(call)
        return Prepared(
            method=call.method,
            url=self.base_url + call.path,
            headers=headers,
            params=list(call.query),
            json=body,
            timeout=call.timeout,
        )

    def sign_tool(self, call: Call) -> dict[str, Any]:
        """The signed body of a tool call (seed 003 §4.3), new nonce and time each time."""
        tool = call.tool
        if tool is None:
            raise ValueError("a signed call needs its tool parameters")
        user = tool.user_id or self.user_id
        if not user:
            raise ValueError("a signed call needs a user_id (give it to the client or the call)")
        secret = self._need(self._hmac_secret, "the HMAC secret")
        return signing.signed_body(
            secret,
            call.method,
            call.path,
            tool.params,
            user_id=user,
            thread_id=tool.thread_id,
            object_scope=tool.object_scope,
        )

    @staticmethod
    def _need(value: Optional[str], what: str) -> str:
        if not value:
            raise ValueError(f"this call needs {what}; the client was made without it")
        return value

    # --- failures and retries ---------------------------------------------------------------------

    @staticmethod
    def transport_error(call: Call, exc: BaseException) -> errors.ScopefsError:
        """The exception for an attempt that got no answer: compute unreachable on ``/tools/*``."""
        cls: type[errors.ScopefsError] = (
            errors.ComputeUnreachable if call.auth is Auth.SIGNED else errors.ScopefsConnectionError
        )
        what = type(exc).__name__
        message = f"no answer from the scopefs daemon ({what})"
        if call.auth is Auth.SIGNED:
            message += "; nothing was run locally"
        return cls(message, code=None, method=call.method, route=call.route)

    @staticmethod
    def answer_error(call: Call, status: int, body: bytes, headers: Mapping[str, str]) -> errors.ScopefsError:
        """The exception for an error answer."""
        return errors.error_from_answer(status, body[:MAX_ERROR_BODY], headers, method=call.method, route=call.route)

    def retry_delay(self, call: Call, attempt: int, err: errors.ScopefsError) -> Optional[float]:
        """Seconds to wait before trying ``call`` again after failed ``attempt`` (1-based), or
        ``None``: do not retry (not idempotent, out of attempts, or a failure a retry cannot fix)."""
        if not call.idempotent or attempt >= self.retry.attempts or not self.retry.retryable(err):
            return None
        return self.retry.delay(attempt, err.retry_after)

    # --- answers ----------------------------------------------------------------------------------

    @staticmethod
    def decode(call: Call, status: int, body: bytes) -> Any:
        """The value a successful answer gives the caller."""
        if call.answer is Answer.READY:
            return status == 200
        if call.answer is Answer.EMPTY:
            return None
        if call.answer is Answer.TEXT:
            return body.decode("utf-8")
        try:
            value = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise errors.ScopefsError(
                "the answer is not JSON", status=status, method=call.method, route=call.route
            ) from None
        if not isinstance(value, dict):
            raise errors.ScopefsError(
                "the answer is not a JSON object", status=status, method=call.method, route=call.route
            )
        return value


# --- request bodies -------------------------------------------------------------------------------


def new_key(prefix: str) -> str:
    """A fresh idempotency key (kept for every retry of the call that made it)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def amount_text(amount: Union[str, Decimal, int]) -> str:
    """A money amount as the API takes it: a decimal string. ``int`` is micro-units; ``float`` is refused."""
    if isinstance(amount, bool) or isinstance(amount, float):
        raise TypeError("money is a decimal string, a Decimal or integer micro-units, never a float")
    if isinstance(amount, int):
        return str((Decimal(amount) / Decimal(1_000_000)).quantize(Decimal("0.000001")))
    if isinstance(amount, Decimal):
        return str(amount.quantize(Decimal("0.000001")))
    if isinstance(amount, str):
        Decimal(amount)  # refuses what is not a number
        return amount
    raise TypeError("money is a decimal string, a Decimal or integer micro-units")


def drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` without the keys whose value is ``None`` (optional fields left out)."""
    return {k: v for k, v in values.items() if v is not None}


def flag(value: bool) -> str:
    """A boolean query flag as the workspace routes read it."""
    return "1" if value else "0"


def query(**values: Any) -> list[tuple[str, str]]:
    """Query pairs of the values that are not ``None`` (``threadId`` and ``snapshotId`` keep their case)."""
    return [(k, str(v)) for k, v in values.items() if v is not None]


def file_chunks(source: Union[bytes, IO[bytes], Iterable[bytes]]) -> Iterator[bytes]:
    """The chunks of a sync source: bytes whole, a file object read ``CHUNK`` bytes at a time."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        yield bytes(source)
        return
    read = getattr(source, "read", None)
    if callable(read):
        while True:
            chunk = read(CHUNK)
            if not chunk:
                return
            yield chunk
        return
    for chunk in source:
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise TypeError("a streamed body yields bytes")
        yield bytes(chunk)


def multipart_boundary() -> str:
    """A boundary that no content could contain by accident (128 random bits)."""
    return "scopefs-" + uuid.uuid4().hex


def part_header(boundary: str, name: str, filename: Optional[str]) -> bytes:
    """The opening of one multipart part: its boundary line and headers."""
    for text in (name, filename or ""):
        if any(c in text for c in '"\r\n\\'):
            raise ValueError("multipart names and filenames may not contain quotes, backslashes or line breaks")
    disposition = f'form-data; name="{name}"'
    if filename is not None:
        disposition += f'; filename="{filename}"'
    head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
    if filename is not None:
        head += "Content-Type: application/octet-stream\r\n"
    return (head + "\r\n").encode("utf-8")


def multipart_end(boundary: str) -> bytes:
    """The closing boundary."""
    return f"--{boundary}--\r\n".encode("ascii")


def upload_parts(files: Union[Mapping[str, Source], Sequence[tuple[str, Source]]]) -> list[tuple[str, Source]]:
    """The ``(filename, source)`` pairs of an upload (a filename may hold sub-directories)."""
    pairs = list(files.items()) if isinstance(files, Mapping) else list(files)
    if not pairs:
        raise ValueError("an upload needs at least one file")
    return pairs
