"""scopefs_client: a typed Python client of the scopefs daemon's HTTP API.

- :class:`ScopefsClient` (sync) and :class:`AsyncScopefsClient` (async) share one request-building
  core (``_core``) and one definition of every route (``_routes``).
- :mod:`scopefs_client.signing` is seed 003 §4.3's HMAC signer of ``/tools/*`` bodies.
- :mod:`scopefs_client.errors` has one exception class per API error code.
"""

from . import errors, signing
from ._core import Auth, Call, RetryPolicy
from ._routes import decode_download
from .aio import AsyncDownload, AsyncScopefsClient
from .client import Download, ScopefsClient
from .errors import ComputeUnavailable, ComputeUnreachable, ScopefsConnectionError, ScopefsError

__version__ = "0.1.0"

__all__ = [
    "AsyncDownload",
    "AsyncScopefsClient",
    "Auth",
    "Call",
    "ComputeUnavailable",
    "ComputeUnreachable",
    "Download",
    "RetryPolicy",
    "ScopefsClient",
    "ScopefsConnectionError",
    "ScopefsError",
    "decode_download",
    "errors",
    "signing",
]
