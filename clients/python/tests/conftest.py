"""Shared fixtures: the live daemon the Rust harness (tests/clients_python.rs) started, clients for
it, and fresh provisioned threads.

The daemon is named by ``SCOPEFS_CLIENT_TEST_*`` variables. A test that needs it fails — never
skips — when they are missing: run ``cargo test --test clients_python`` (which sets them).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from scopefs_client import ScopefsClient


@dataclass(frozen=True)
class Live:
    """The live daemon; its secrets stay out of the repr (and so out of failure reports)."""

    url: str
    service_token: str = field(repr=False)
    admin_token: str = field(repr=False)
    hmac_secret: str = field(repr=False)
    user: str = ""
    image: str = ""


def _need(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        pytest.fail(f"{name} is not set: run `cargo test --test clients_python` (it starts the daemon)")
    return value


@pytest.fixture(scope="session")
def live() -> Live:
    return Live(
        url=_need("SCOPEFS_CLIENT_TEST_URL"),
        service_token=_need("SCOPEFS_CLIENT_TEST_SERVICE_TOKEN"),
        admin_token=_need("SCOPEFS_CLIENT_TEST_ADMIN_TOKEN"),
        hmac_secret=_need("SCOPEFS_CLIENT_TEST_HMAC_SECRET"),
        user=_need("SCOPEFS_CLIENT_TEST_USER"),
        image=_need("SCOPEFS_CLIENT_TEST_IMAGE"),
    )


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository (for the golden vector kept in tests/tools_signing.rs and the daemon's source)."""
    return Path(os.environ.get("SCOPEFS_CLIENT_TEST_REPO") or Path(__file__).resolve().parents[3])


@pytest.fixture(scope="session")
def client(live: Live) -> Iterator[ScopefsClient]:
    with ScopefsClient(
        live.url,
        service_token=live.service_token,
        admin_token=live.admin_token,
        hmac_secret=live.hmac_secret,
        user_id=live.user,
    ) as c:
        yield c


def new_thread() -> str:
    return "thr_" + uuid.uuid4().hex


@pytest.fixture
def thread(client: ScopefsClient, live: Live) -> str:
    """A fresh thread with a provisioned scope of the test user."""
    t = new_thread()
    client.provision(t, user_id=live.user)
    return t
