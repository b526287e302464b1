"""The synchronous client, :class:`ScopefsClient`: every route of :mod:`scopefs_client._routes`
plus the streamed workspace routes (multipart upload, body upload, file and zip download).
"""

from __future__ import annotations

import contextlib
import time
from typing import IO, Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

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
    file_chunks,
    multipart_boundary,
    multipart_end,
    part_header,
    query,
    upload_parts,
)
from ._routes import Routes

SyncSource = Union[bytes, IO[bytes], Iterable[bytes]]


class Download:
    """A streamed answer (a file or the workspace zip): its status, headers and chunks."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status: int = response.status_code
        self.content_type: Optional[str] = response.headers.get("content-type")
        length = response.headers.get("content-length")
        self.content_length: Optional[int] = int(length) if length is not None else None
        self.content_range: Optional[str] = response.headers.get("content-range")
        self.etag: Optional[str] = response.headers.get("etag")
        self.content_disposition: Optional[str] = response.headers.get("content-disposition")

    def iter_bytes(self) -> Iterator[bytes]:
        """The body, chunk by chunk, as it arrives; a body that breaks off raises
        :class:`~scopefs_client.errors.ScopefsConnectionError` (never retried: part was delivered)."""
        try:
            yield from self._response.iter_bytes()
        except httpx.TransportError as exc:
            raise errors.ScopefsConnectionError(
                f"the answer broke off ({type(exc).__name__})", status=self.status
            ) from None


class ScopefsClient(Routes[Json, bool, str, None]):
    """A synchronous scopefs client over ``httpx.Client``.

    ``service_token`` serves ``/internal/*``, ``/api/workspace*`` and ``/metrics``;
    ``admin_token`` serves ``/admin/*``; ``hmac_secret`` signs ``/tools/*`` as ``user_id`` (each call
    may name another user). ``transport`` replaces httpx's (tests). ``sleep`` is how retries wait.
    """

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
        transport: Optional[httpx.BaseTransport] = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._core = Core(
            base_url,
            service_token=service_token,
            admin_token=admin_token,
            hmac_secret=hmac_secret,
            user_id=user_id,
            retry=retry,
        )
        self._http = httpx.Client(timeout=timeout, transport=transport, follow_redirects=False)
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"ScopefsClient({self._core.base_url!r})"

    def close(self) -> None:
        """Closes the connection pool."""
        self._http.close()

    def __enter__(self) -> "ScopefsClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- sending ----------------------------------------------------------------------------------

    def _request(
        self, call: Call, content: Optional[Iterable[bytes]] = None, headers: Optional[Mapping[str, str]] = None
    ) -> httpx.Request:
        return build_request(self._http, self._core.prepare(call), content=content, headers=headers)

    def _attempts(self, call: Call, send: Callable[[], httpx.Response]) -> httpx.Response:
        """Sends (``send`` builds and sends one attempt) until an answer below 400, retrying as the
        core allows; raises the mapped exception otherwise. A streamed answer stays open."""
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = send()
            except httpx.TransportError as exc:
                err = self._core.transport_error(call, exc)
                if call.answer is Answer.READY:
                    # A readiness probe that reaches nothing: not ready (answered as a 503 would be).
                    return httpx.Response(503)
            else:
                if resp.status_code < 400 or (call.answer is Answer.READY and resp.status_code == 503):
                    return resp
                err = self._core.answer_error(call, resp.status_code, _bounded_body(resp), resp.headers)
                resp.close()
            delay = self._core.retry_delay(call, attempt, err)
            if delay is None:
                raise err
            self._sleep(delay)

    def _run(self, call: Call) -> Any:
        resp = self._attempts(call, lambda: self._http.send(self._request(call)))
        return self._core.decode(call, resp.status_code, resp.content)

    # --- streamed workspace routes ----------------------------------------------------------------

    @contextlib.contextmanager
    def workspace_stream(
        self,
        thread_id: str,
        path: str,
        *,
        byte_range: Optional[tuple[int, Optional[int]]] = None,
        snapshot_id: Optional[str] = None,
        download: bool = False,
    ) -> Iterator[Download]:
        """A file's content, streamed; ``byte_range`` ``(first, last)`` inclusive (``last`` ``None``:
        to the end) asks for part of it (206). Opening is retried; the body is not."""
        q = query(threadId=thread_id, path=path, snapshotId=snapshot_id, download="1" if download else None)
        call = Call("GET", "/api/workspace/file", Auth.SERVICE, query=q, idempotent=True)
        headers = {"range": _range_header(byte_range)} if byte_range is not None else {}
        with self._open_stream(call, headers) as d:
            yield d

    def workspace_read(self, thread_id: str, path: str, **kw: Any) -> bytes:
        """A file's whole content (for small files; see :meth:`workspace_download_to`)."""
        with self.workspace_stream(thread_id, path, **kw) as d:
            return b"".join(d.iter_bytes())

    def workspace_download_to(self, thread_id: str, path: str, dest: IO[bytes], **kw: Any) -> int:
        """Streams a file into ``dest``; the number of bytes written."""
        with self.workspace_stream(thread_id, path, **kw) as d:
            return _copy(d.iter_bytes(), dest)

    @contextlib.contextmanager
    def workspace_zip_stream(self, thread_id: str, *, snapshot_id: Optional[str] = None) -> Iterator[Download]:
        """The workspace (or one of its snapshots) as a zip, streamed."""
        q = query(threadId=thread_id, snapshotId=snapshot_id)
        call = Call("GET", "/api/workspace/download", Auth.SERVICE, query=q, idempotent=True)
        with self._open_stream(call, {}) as d:
            yield d

    def workspace_zip_to(self, thread_id: str, dest: IO[bytes], *, snapshot_id: Optional[str] = None) -> int:
        """Streams the workspace zip into ``dest``; the number of bytes written."""
        with self.workspace_zip_stream(thread_id, snapshot_id=snapshot_id) as d:
            return _copy(d.iter_bytes(), dest)

    def workspace_upload(
        self,
        thread_id: str,
        files: Union[Mapping[str, SyncSource], Sequence[tuple[str, SyncSource]]],
        *,
        dir: Optional[str] = None,
        overwrite: bool = False,
    ) -> Json:
        """Multipart upload of files (``{filename: source}``), each streamed from its source
        (bytes, a binary file object, or an iterable of chunks). Sent once: a stream is not replayed."""
        parts = upload_parts(files)
        boundary = multipart_boundary()
        q = query(threadId=thread_id, dir=dir, overwrite="1" if overwrite else None)
        call = Call("POST", "/api/workspace/upload", Auth.SERVICE, query=q)

        def body() -> Iterator[bytes]:
            for name, source in parts:
                yield part_header(boundary, "file", name)
                yield from file_chunks(source)  # type: ignore[arg-type]
                yield b"\r\n"
            yield multipart_end(boundary)

        headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
        resp = self._attempts(call, lambda: self._http.send(self._request(call, body(), headers)))
        return self._core.decode(call, resp.status_code, resp.content)  # type: ignore[no-any-return]

    def workspace_write(self, thread_id: str, path: str, content: SyncSource) -> Json:
        """Writes ``content`` (streamed) as the file's new version (atomic replace). Sent once."""
        call = Call("PUT", "/api/workspace/file", Auth.SERVICE, query=query(threadId=thread_id, path=path))
        headers = {"content-type": "application/octet-stream"}
        resp = self._attempts(call, lambda: self._http.send(self._request(call, file_chunks(content), headers)))
        return self._core.decode(call, resp.status_code, resp.content)  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def _open_stream(self, call: Call, headers: Mapping[str, str]) -> Iterator[Download]:
        resp = self._attempts(call, lambda: self._http.send(self._request(call, headers=headers), stream=True))
        try:
            yield Download(resp)
        finally:
            resp.close()


def _bounded_body(resp: httpx.Response) -> bytes:
    """At most ``MAX_ERROR_BODY`` bytes of an (error) answer, streamed or not."""
    if not resp.is_stream_consumed:
        out = b""
        for chunk in resp.iter_bytes():
            out += chunk
            if len(out) >= MAX_ERROR_BODY:
                break
        return out[:MAX_ERROR_BODY]
    return resp.content[:MAX_ERROR_BODY]


def _range_header(byte_range: tuple[int, Optional[int]]) -> str:
    first, last = byte_range
    return f"bytes={first}-" + ("" if last is None else str(last))


def _copy(chunks: Iterator[bytes], dest: IO[bytes]) -> int:
    n = 0
    for chunk in chunks:
        dest.write(chunk)
        n += len(chunk)
    return n


__all__ = ["Download", "ScopefsClient", "errors"]
