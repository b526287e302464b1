"""The async client against the live daemon: every route family (driven with ``asyncio.run``),
streamed upload and download, the zip, and error mapping."""

from __future__ import annotations

import asyncio
import hashlib
import io
import uuid
import zipfile
from typing import AsyncIterator

import pytest

from conftest import Live
from scopefs_client import AsyncScopefsClient, errors


def make(live: Live) -> AsyncScopefsClient:
    return AsyncScopefsClient(
        live.url,
        service_token=live.service_token,
        admin_token=live.admin_token,
        hmac_secret=live.hmac_secret,
        user_id=live.user,
    )


async def agen(total: int) -> AsyncIterator[bytes]:
    block = b"async-chunk-" * 5000
    sent = 0
    while sent < total:
        piece = block[: min(len(block), total - sent)]
        sent += len(piece)
        yield piece


def test_async_internal_workspace_and_public_routes(live: Live) -> None:
    async def scenario() -> None:
        async with make(live) as c:
            assert await c.ready() is True
            assert (await c.health())["status"] == "ok"
            t = "thr_" + uuid.uuid4().hex
            scope = await c.provision(t, user_id=live.user)
            assert (await c.scope_by_thread(t))["scope_id"] == scope["scope_id"]
            with pytest.raises(errors.ScopeNotFound):
                await c.scope_by_thread("thr_" + uuid.uuid4().hex)

            size = 2 * 1024 * 1024 + 7
            up = await c.workspace_upload(t, {"a/stream.bin": agen(size), "b.txt": io.BytesIO(b"bee")})
            assert sorted(f["size"] for f in up["files"]) == [3, size]
            h = hashlib.sha256()
            async with c.workspace_stream(t, "a/stream.bin") as d:
                assert d.content_length == size
                async for chunk in d.aiter_bytes():
                    h.update(chunk)
            want = hashlib.sha256()
            async for chunk in agen(size):
                want.update(chunk)
            assert h.hexdigest() == want.hexdigest()
            await c.workspace_write(t, "c.txt", agen(10))
            assert await c.workspace_read(t, "c.txt") == b"async-chun"
            assert await c.workspace_read(t, "c.txt", byte_range=(6, 9)) == b"chun"
            sink = io.BytesIO()
            await c.workspace_zip_to(t, sink)
            with zipfile.ZipFile(sink) as z:
                assert {"a/stream.bin", "b.txt", "c.txt"} <= set(z.namelist())
            assert (await c.workspace_list(t, "a"))["entries"][0]["name"] == "stream.bin"
            with pytest.raises(errors.FileExists):
                await c.workspace_upload(t, {"b.txt": b"again"})
            await c.workspace_delete(t, "b.txt")
            with pytest.raises(errors.NotFound):
                await c.workspace_read(t, "b.txt")

    asyncio.run(scenario())


def test_async_tools_compute_and_admin(live: Live) -> None:
    async def scenario() -> None:
        async with make(live) as c:
            t = "thr_" + uuid.uuid4().hex
            await c.provision(t, user_id=live.user)
            await c.write_file(t, "x.txt", "async text")
            assert (await c.read_file(t, "x.txt"))["content"] == "async text"
            with pytest.raises(errors.FileNotFound):
                await c.read_file(t, "y.txt")
            env = (await c.create_environment(t))["environment_id"]
            out = await c.execute_command(t, env, "cat /workspace/x.txt")
            assert out["stdout"] == "async text"
            done = await c.destroy_environment(t, env)
            assert done["already_ended"] is False and done["status"] != "running" and done["ended_at"]
            with pytest.raises(errors.EnvironmentNotRunning):
                await c.execute_command(t, env, "true")
            user = "acct_" + uuid.uuid4().hex[:10]
            entry = (await c.credit(user, "0.250000", idempotency_key="a-" + user))["entry"]
            assert entry["amount"] == "0.250000"
            assert (await c.ledger(user))["entries"][0]["amount"] == "0.250000"
            with pytest.raises(errors.UnknownPlan):
                await c.set_plan(user, "nope")
            assert "usage" in await c.pending_usage()

    asyncio.run(scenario())
