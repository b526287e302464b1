"""The asynchronous client, :class:`AsyncScopefsClient`: the same routes as the sync client
(every method returns a coroutine), over ``httpx.AsyncClient``, with async streamed bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import IO, Any, AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Optional, Sequence, Union

import httpx

from . import errors
from ._core import (
    MAX_ERROR_BODY,
    Answer,
    Auth,
    Call,
    Core,
    Json,
    RetryPolicy,
    build_request,
    Source,
    file_chunks,
    multipart_boundary,
    multipart_end,
    part_header,
    query,
    upload_parts,
)
from ._routes import Routes


class AsyncDownload:
    """A streamed answer of the async client: its status, headers and chunks."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status: int = response.status_code
        self.content_type: Optional[str] = response.headers.get("content-type")
        length = response.headers.get("content-length")
        self.content_length: Optional[int] = int(length) if length is not None else None
        self.content_range: Optional[str] = response.headers.get("content-range")
        self.etag: Optional[str] = response.headers.get("etag")
        self.content_disposition: Optional[str] = response.headers.get("content-disposition")

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk, as it arrives (a break raises ``ScopefsConnectionError``)."""
        try:
            async for chunk in self._response.aiter_bytes():
                yield chunk
        except httpx.TransportError as exc:
            raise errors.ScopefsConnectionError(
                f"the answer broke off ({type(exc).__name__})", status=self.status
            ) from None


class AsyncScopefsClient(Routes[Awaitable[Json], Awaitable[bool], Awaitable[str], Awaitable[None]]):
    """An asynchronous scopefs client over ``httpx.AsyncClient`` (arguments as :class:`ScopefsClient`)."""

    def __init__(
        self,
        base_url: str,
        *,
        service_token: Optional[str] = None,
        admin_token: Optional[str] = None,
        hmac_secret: Optional[str] = None,
        user_id: Optional[str] = None,
        timeout: float = 60.0,
        retry: Optional[RetryPolicy] = None,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._core = Core(
            base_url,
            service_token=service_token,
            admin_token=admin_token,
            hmac_secret=hmac_secret,
            user_id=user_id,
            retry=retry,
        )
        self._http = httpx.AsyncClient(timeout=timeout, transport=transport, follow_redirects=False)
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"AsyncScopefsClient({self._core.base_url!r})"

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncScopefsClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # --- sending ----------------------------------------------------------------------------------

    def _request(
        self, call: Call, content: Optional[AsyncIterable[bytes]] = None, headers: Optional[Mapping[str, str]] = None
    ) -> httpx.Request:
        return build_request(self._http, self._core.prepare(call), content=content, headers=headers)

    async def _attempts(self, call: Call, send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        """As the sync client's: sends until an answer below 400, retrying as the core allows."""
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = await send()
            except httpx.TransportError as exc:
                err = self._core.transport_error(call, exc)
                if call.answer is Answer.READY:
                    # A readiness probe that reaches nothing: not ready (answered as a 503 would be).
                    return httpx.Response(503)
            else:
                if resp.status_code < 400 or (call.answer is Answer.READY and resp.status_code == 503):
                    return resp
                err = self._core.answer_error(call, resp.status_code, await _bounded_body(resp), resp.headers)
                await resp.aclose()
            delay = self._core.retry_delay(call, attempt, err)
            if delay is None:
                raise err
            await self._sleep(delay)

    def _run(self, call: Call) -> Awaitable[Any]:
        async def go() -> Any:
            resp = await self._attempts(call, lambda: self._http.send(self._request(call)))
            return self._core.decode(call, resp.status_code, resp.content)

        return go()

    # --- streamed workspace routes ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def workspace_stream(
        self,
        thread_id: str,
        path: str,
        *,
        byte_range: Optional[tuple[int, Optional[int]]] = None,
        snapshot_id: Optional[str] = None,
        download: bool = False,
    ) -> AsyncIterator[AsyncDownload]:
        """A file's content, streamed (as :meth:`ScopefsClient.workspace_stream`)."""
        q = query(threadId=thread_id, path=path, snapshotId=snapshot_id, download="1" if download else None)
        call = Call("GET", "/api/workspace/file", Auth.SERVICE, query=q, idempotent=True)
        headers = {}
        if byte_range is not None:
            first, last = byte_range
            headers["range"] = f"bytes={first}-" + ("" if last is None else str(last))
        async with self._open_stream(call, headers) as d:
            yield d

    async def workspace_read(self, thread_id: str, path: str, **kw: Any) -> bytes:
        """A file's whole content."""
        async with self.workspace_stream(thread_id, path, **kw) as d:
            return b"".join([c async for c in d.aiter_bytes()])

    async def workspace_download_to(self, thread_id: str, path: str, dest: IO[bytes], **kw: Any) -> int:
        """Streams a file into ``dest``; the number of bytes written."""
        async with self.workspace_stream(thread_id, path, **kw) as d:
            return await _copy(d.aiter_bytes(), dest)

    @contextlib.asynccontextmanager
    async def workspace_zip_stream(
        self, thread_id: str, *, snapshot_id: Optional[str] = None
    ) -> AsyncIterator[AsyncDownload]:
        """The workspace zip, streamed."""
        q = query(threadId=thread_id, snapshotId=snapshot_id)
        call = Call("GET", "/api/workspace/download", Auth.SERVICE, query=q, idempotent=True)
        async with self._open_stream(call, {}) as d:
            yield d

    async def workspace_zip_to(self, thread_id: str, dest: IO[bytes], *, snapshot_id: Optional[str] = None) -> int:
        """Streams the workspace zip into ``dest``; the number of bytes written."""
        async with self.workspace_zip_stream(thread_id, snapshot_id=snapshot_id) as d:
            return await _copy(d.aiter_bytes(), dest)

    async def workspace_upload(
        self,
        thread_id: str,
        files: Union[Mapping[str, Source], Sequence[tuple[str, Source]]],
        *,
        dir: Optional[str] = None,
        overwrite: bool = False,
    ) -> Json:
        """Multipart upload, each file streamed from its source (bytes, a binary file object, an
        iterable or an async iterable of chunks). Sent once."""
        parts = upload_parts(files)
        boundary = multipart_boundary()
        q = query(threadId=thread_id, dir=dir, overwrite="1" if overwrite else None)
        call = Call("POST", "/api/workspace/upload", Auth.SERVICE, query=q)

        async def body() -> AsyncIterator[bytes]:
            for name, source in parts:
                yield part_header(boundary, "file", name)
                async for chunk in _achunks(source):
                    yield chunk
                yield b"\r\n"
            yield multipart_end(boundary)

        headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
        resp = await self._attempts(call, lambda: self._http.send(self._request(call, body(), headers)))
        return self._core.decode(call, resp.status_code, resp.content)  # type: ignore[no-any-return]

    async def workspace_write(self, thread_id: str, path: str, content: Source) -> Json:
        """Writes ``content`` (streamed) as the file's new version. Sent once."""
        call = Call("PUT", "/api/workspace/file", Auth.SERVICE, query=query(threadId=thread_id, path=path))
        headers = {"content-type": "application/octet-stream"}
        resp = await self._attempts(call, lambda: self._http.send(self._request(call, _achunks(content), headers)))
        return self._core.decode(call, resp.status_code, resp.content)  # type: ignore[no-any-return]

    @contextlib.asynccontextmanager
    async def _open_stream(self, call: Call, headers: Mapping[str, str]) -> AsyncIterator[AsyncDownload]:
        resp = await self._attempts(call, lambda: self._http.send(self._request(call, headers=headers), stream=True))
        try:
            yield AsyncDownload(resp)
        finally:
            await resp.aclose()


async def _achunks(source: Source) -> AsyncIterator[bytes]:
    """The chunks of a source, sync or async (a sync file object is read in chunks)."""
    if hasattr(source, "__aiter__"):
        async for chunk in source:
            yield bytes(chunk)
        return
    for chunk in file_chunks(source):
        yield chunk


async def _bounded_body(resp: httpx.Response) -> bytes:
    if not resp.is_stream_consumed:
        out = b""
        async for chunk in resp.aiter_bytes():
            out += chunk
            if len(out) >= MAX_ERROR_BODY:
                break
        return out[:MAX_ERROR_BODY]
    return resp.content[:MAX_ERROR_BODY]


async def _copy(chunks: AsyncIterator[bytes], dest: IO[bytes]) -> int:
    n = 0
    async for chunk in chunks:
        dest.write(chunk)
        n += len(chunk)
    return n


__all__ = ["AsyncDownload", "AsyncScopefsClient"]
