"""The retry policy against a small in-process stub server: idempotent calls are retried (boundedly,
with backoff, a signed one re-signed with a fresh nonce each time), others are sent exactly once;
a ``/tools/*`` call that reaches nothing is ``ComputeUnavailable``."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator, Optional, Union

import pytest

from scopefs_client import AsyncScopefsClient, RetryPolicy, ScopefsClient, errors, signing

SECRET = "stub-secret"
SERVICE = "stub-service-token-do-not-print"
DROP = "drop"
SHORT = "short"
Action = Union[str, tuple[int, dict[str, Any], dict[str, str]]]


class Stub:
    """An HTTP server answering each request with the next scripted action (``DROP``: close the
    connection without an answer), recording what it received."""

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.seen: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def handle_one(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                with stub.lock:
                    stub.seen.append(
                        {"method": self.command, "path": self.path, "body": json.loads(raw) if raw else None}
                    )
                    action = stub.actions.pop(0) if stub.actions else (500, {"error": {"code": "x", "message": ""}}, {})
                if action == DROP:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if action == SHORT:  # promises 1000 bytes, sends 10, hangs up
                    self.send_response(200)
                    self.send_header("content-length", "1000")
                    self.end_headers()
                    self.wfile.write(b"0123456789")
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                status, body, headers = action  # type: ignore[misc]
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def err(code: str, status: int = 503, retry_after: Optional[str] = None) -> Action:
    return (status, {"error": {"code": code, "message": "stub"}}, {"retry-after": retry_after} if retry_after else {})


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    yield s
    s.close()


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, d: float) -> None:
        self.delays.append(d)


POLICY = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)


def make(url: str, sleeps: Sleeps) -> ScopefsClient:
    return ScopefsClient(url, service_token=SERVICE, hmac_secret=SECRET, user_id="u1", retry=POLICY, sleep=sleeps)


def test_a_retried_signed_call_is_signed_again_with_a_fresh_nonce(stub: Stub) -> None:
    stub.actions = [DROP, (200, {"path": "/workspace/a.txt", "content": "x", "size_bytes": 1}, {})]
    sleeps = Sleeps()
    with make(stub.url, sleeps) as c:
        assert c.read_file("thr_r", "a.txt")["content"] == "x"
    assert len(stub.seen) == 2 and len(sleeps.delays) == 1
    first, second = (s["body"] for s in stub.seen)
    assert first["auth_context"]["nonce"] != second["auth_context"]["nonce"]
    assert first["auth_context"]["token"] != second["auth_context"]["token"]
    for body in (first, second):
        assert body["auth_context"]["thread_id"] == "thr_r" and body["path"] == "a.txt"
        assert signing.verify(SECRET, "POST", "/tools/read_file", body)


def test_a_call_that_is_not_idempotent_is_sent_once(stub: Stub) -> None:
    stub.actions = [DROP, (200, {}, {})]
    sleeps = Sleeps()
    with make(stub.url, sleeps) as c:
        with pytest.raises(errors.ComputeUnreachable) as caught:
            c.execute_command("thr_r", "env_1", "touch /tmp/never")
        assert caught.value.status is None and "nothing was run locally" in str(caught.value)
        stub.actions = [err("busy"), (200, {}, {})]
        with pytest.raises(errors.Busy):
            c.write_file("thr_r", "a.txt", "x")
        stub.actions = [err("compute_unavailable"), (200, {}, {})]
        with pytest.raises(errors.ComputeUnavailable) as unavailable:
            c.create_environment("thr_r")
        assert unavailable.value.status == 503 and type(unavailable.value) is errors.ComputeUnavailable
    assert [s["path"] for s in stub.seen] == [
        "/tools/execute_command",
        "/tools/write_file",
        "/tools/create_environment",
    ]
    assert sleeps.delays == []


def test_retries_are_bounded_back_off_and_honour_retry_after(stub: Stub) -> None:
    stub.actions = [err("busy", retry_after="0.04")] * 10
    sleeps = Sleeps()
    with make(stub.url, sleeps) as c:
        with pytest.raises(errors.Busy) as caught:
            c.workspace_usage("thr_r")
    assert caught.value.retry_after == 0.04
    assert len(stub.seen) == POLICY.attempts and len(sleeps.delays) == POLICY.attempts - 1
    assert all(0.04 <= d <= POLICY.max_delay for d in sleeps.delays)
    # Without Retry-After: exponential, jittered, capped.
    policy = RetryPolicy(attempts=6, base_delay=0.1, max_delay=0.5)
    for n in range(1, 6):
        d = policy.delay(n, None)
        assert min(0.5, 0.1 * 2 ** (n - 1)) * 0.5 <= d <= min(0.5, 0.1 * 2 ** (n - 1))


def test_a_keyed_post_is_retried_with_the_same_key(stub: Stub) -> None:
    stub.actions = [DROP, err("not_ready"), (201, {"scope_id": "s", "created": True}, {})]
    sleeps = Sleeps()
    with make(stub.url, sleeps) as c:
        assert c.provision("thr_r")["created"] is True
    keys = {s["body"]["operation_id"] for s in stub.seen}
    assert len(stub.seen) == 3 and len(keys) == 1


def test_errors_that_a_retry_cannot_fix_are_not_retried(stub: Stub) -> None:
    stub.actions = [err("unauthorized", 401), (200, {}, {})]
    sleeps = Sleeps()
    with make(stub.url, sleeps) as c:
        with pytest.raises(errors.Unauthorized) as caught:
            c.workspace_usage("thr_r")
    assert len(stub.seen) == 1 and sleeps.delays == []
    assert SERVICE not in str(caught.value) and SERVICE not in repr(c)


def test_an_unreachable_daemon() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = Sleeps()
    with make(f"http://127.0.0.1:{port}", sleeps) as c:
        assert c.ready() is False
        with pytest.raises(errors.ScopefsConnectionError) as plain:
            c.workspace_usage("thr_r")
        assert not isinstance(plain.value, errors.ComputeUnavailable)
        with pytest.raises(errors.ComputeUnreachable):
            c.list_dir("thr_r")
    # Both idempotent calls were tried `attempts` times; ready() is a probe and is not retried.
    assert len(sleeps.delays) == 2 * (POLICY.attempts - 1)


def test_the_async_client_retries_and_refrains_alike(stub: Stub) -> None:
    delays: list[float] = []

    async def sleep(d: float) -> None:
        delays.append(d)

    async def scenario() -> None:
        async with AsyncScopefsClient(stub.url, hmac_secret=SECRET, user_id="u1", retry=POLICY, sleep=sleep) as c:
            stub.actions = [DROP, (200, {"path": "/workspace", "entries": [], "truncated": False}, {})]
            assert (await c.list_dir("thr_a"))["entries"] == []
            stub.actions = [DROP, (200, {}, {})]
            with pytest.raises(errors.ComputeUnreachable):
                await c.start_process("thr_a", "sleep 1")

    asyncio.run(scenario())
    assert [s["path"] for s in stub.seen] == ["/tools/list_dir", "/tools/list_dir", "/tools/start_process"]
    assert stub.seen[0]["body"]["auth_context"]["nonce"] != stub.seen[1]["body"]["auth_context"]["nonce"]
    assert len(delays) == 1


def test_a_download_that_breaks_off_raises_a_connection_error(stub: Stub) -> None:
    stub.actions = [SHORT, SHORT]
    sleeps = Sleeps()
    with make(stub.url, sleeps) as c:
        with pytest.raises(errors.ScopefsConnectionError) as caught:
            c.workspace_read("thr_r", "big.bin")
    assert caught.value.status == 200 and "broke off" in str(caught.value)
    # The answer had begun: the body is never re-requested.
    assert len(stub.seen) == 1 and sleeps.delays == []

    async def scenario() -> None:
        async with AsyncScopefsClient(stub.url, service_token=SERVICE, retry=POLICY) as c:
            await c.workspace_read("thr_r", "big.bin")

    with pytest.raises(errors.ScopefsConnectionError):
        asyncio.run(scenario())
