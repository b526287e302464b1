"""The request signer of seed 003 §4.3: HMAC-SHA256 over a canonical string of the request.

Every ``/tools/*`` body carries ``auth_context`` (``user_id``, ``thread_id``, ``issued_at``,
``nonce``, optional ``object_scope``) and its ``token``. The token is the lowercase hex
HMAC-SHA256, keyed with the shared secret, of::

    METHOD \\n PATH \\n issued_at \\n nonce \\n sha256(canonical_json(body without auth_context.token))

where ``canonical_json`` is ``json.dumps(obj, ensure_ascii=False, sort_keys=True,
separators=(",", ":"))`` — exactly the seed's form, which the daemon reproduces byte for byte.

Nothing in this module logs or returns the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from typing import Any, Mapping, Optional


def canonical_json(obj: Any) -> str:
    """The seed's canonical JSON text of ``obj``: keys sorted at every level, no spaces, no ASCII escaping."""
    return json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def payload_hash(body_without_token: Mapping[str, Any]) -> str:
    """Lowercase hex SHA-256 of the canonical JSON (UTF-8) of a body whose ``auth_context`` has no token."""
    return hashlib.sha256(canonical_json(body_without_token).encode("utf-8")).hexdigest()


def canonical_string(method: str, path: str, issued_at: int, nonce: str, body_hash: str) -> str:
    """The five lines that are signed (four LF, none trailing); ``path`` has no scheme, host or query."""
    return "\n".join([method.upper(), path, str(issued_at), nonce, body_hash])


def sign(secret: str, canonical: str) -> str:
    """Lowercase hex HMAC-SHA256 of ``canonical`` keyed with ``secret`` (both UTF-8)."""
    return hmac.new(secret.encode("utf-8"), canonical.encode("utf-8"), hashlib.sha256).hexdigest()


def new_nonce() -> str:
    """A fresh single-use nonce (128 random bits, hex), as the seed's gateway draws it."""
    return secrets.token_hex(16)


def signed_body(
    secret: str,
    method: str,
    path: str,
    params: Mapping[str, Any],
    *,
    user_id: str,
    thread_id: Optional[str],
    object_scope: Optional[Mapping[str, Any]] = None,
    issued_at: Optional[int] = None,
    nonce: Optional[str] = None,
) -> dict[str, Any]:
    """The body of a signed request: ``params`` plus ``auth_context`` with its token.

    ``issued_at`` (Unix seconds) and ``nonce`` default to now and a fresh random nonce; give them
    only to reproduce a known vector. ``thread_id`` may be ``None`` only for such a vector (the seed's
    golden body names no thread). A ``params`` key ``auth_context`` is refused.
    """
    if "auth_context" in params:
        raise ValueError("params must not contain auth_context; the signer builds it")
    when = int(time.time()) if issued_at is None else int(issued_at)
    once = new_nonce() if nonce is None else nonce
    auth_context: dict[str, Any] = {"user_id": user_id}
    if thread_id is not None:
        auth_context["thread_id"] = thread_id
    auth_context["issued_at"] = when
    auth_context["nonce"] = once
    if object_scope:
        auth_context["object_scope"] = dict(object_scope)
    body_without_token: dict[str, Any] = {"auth_context": auth_context, **params}
    digest = payload_hash(body_without_token)
    token = sign(secret, canonical_string(method, path, when, once, digest))
    return {"auth_context": {**auth_context, "token": token}, **params}


def verify(secret: str, method: str, path: str, body: Mapping[str, Any]) -> bool:
    """Whether ``body``'s token is the one ``secret`` gives for ``method`` and ``path`` (constant-time compare)."""
    context = body.get("auth_context")
    if not isinstance(context, Mapping) or not isinstance(context.get("token"), str):
        return False
    without = {k: v for k, v in context.items() if k != "token"}
    digest = payload_hash({**body, "auth_context": without})
    expected = sign(secret, canonical_string(method, path, without["issued_at"], without["nonce"], digest))
    return hmac.compare_digest(expected, context["token"])
