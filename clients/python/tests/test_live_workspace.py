"""``/api/workspace*`` against the live daemon: streamed multipart upload and body upload,
streamed download (whole and ranged), the zip, listing, usage, delete, legacy import — and the
main errors as their classes."""

from __future__ import annotations

import hashlib
import io
import uuid
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

from scopefs_client import ScopefsClient, errors

MIB = 1024 * 1024


def chunks(total: int, seed: int) -> Iterator[bytes]:
    """``total`` pseudo-random bytes in 64 KiB chunks, made as they are consumed (never all in memory)."""
    block = hashlib.sha256(str(seed).encode()).digest() * 2048
    sent = 0
    while sent < total:
        piece = block[: min(len(block), total - sent)]
        sent += len(piece)
        yield piece


def digest(total: int, seed: int) -> str:
    h = hashlib.sha256()
    for c in chunks(total, seed):
        h.update(c)
    return h.hexdigest()


def test_streamed_multipart_upload_and_streamed_download(client: ScopefsClient, thread: str) -> None:
    size = 6 * MIB + 123
    small = io.BytesIO(b"name,score\nada,3\n")
    answer = client.workspace_upload(thread, {"big.bin": chunks(size, 1), "sub/data.csv": small}, dir="in")
    assert sorted(f["path"] for f in answer["files"]) == ["in/big.bin", "in/sub/data.csv"]
    assert {f["path"]: f["size"] for f in answer["files"]}["in/big.bin"] == size

    h = hashlib.sha256()
    count = 0
    with client.workspace_stream(thread, "in/big.bin") as d:
        assert d.status == 200 and d.content_length == size
        for chunk in d.iter_bytes():
            h.update(chunk)
            count += 1
    assert h.hexdigest() == digest(size, 1) and count > 1
    sink = io.BytesIO()
    assert client.workspace_download_to(thread, "/in/sub/data.csv", sink) == 17
    assert sink.getvalue() == b"name,score\nada,3\n"

    with pytest.raises(errors.FileExists) as exists:
        client.workspace_upload(thread, {"sub/data.csv": b"again"}, dir="in")
    assert exists.value.status == 409
    client.workspace_upload(thread, [("sub/data.csv", b"replaced")], dir="in", overwrite=True)
    assert client.workspace_read(thread, "in/sub/data.csv") == b"replaced"


def test_ranged_reads(client: ScopefsClient, thread: str) -> None:
    client.workspace_write(thread, "digits.txt", b"0123456789")
    with client.workspace_stream(thread, "digits.txt", byte_range=(2, 5)) as d:
        assert d.status == 206 and d.content_range == "bytes 2-5/10"
        assert b"".join(d.iter_bytes()) == b"2345"
    assert client.workspace_read(thread, "digits.txt", byte_range=(7, None)) == b"789"
    with pytest.raises(errors.RangeNotSatisfiable) as caught:
        client.workspace_read(thread, "digits.txt", byte_range=(50, None))
    assert caught.value.status == 416


def test_streamed_body_upload_from_a_file(client: ScopefsClient, thread: str, tmp_path: Path) -> None:
    path = tmp_path / "payload.bin"
    with open(path, "wb") as f:
        for c in chunks(3 * MIB, 2):
            f.write(c)
    with open(path, "rb") as f:
        written = client.workspace_write(thread, "deep/dir/payload.bin", f)
    assert written["size"] == 3 * MIB and written["virtual_path"] == "/deep/dir/payload.bin"
    with client.workspace_stream(thread, "deep/dir/payload.bin") as d:
        assert hashlib.sha256(b"".join(d.iter_bytes())).hexdigest() == digest(3 * MIB, 2)


def test_the_workspace_zip(client: ScopefsClient, thread: str) -> None:
    client.workspace_write(thread, "a.txt", b"alpha")
    client.workspace_write(thread, "dir/b.txt", b"bravo")
    sink = io.BytesIO()
    n = client.workspace_zip_to(thread, sink)
    assert n == len(sink.getvalue()) > 0
    with zipfile.ZipFile(sink) as z:
        assert z.testzip() is None
        names = set(z.namelist())
        assert {"a.txt", "dir/b.txt"} <= names
        assert z.read("dir/b.txt") == b"bravo"
    with client.workspace_zip_stream(thread) as d:
        assert d.content_type == "application/zip" and "attachment" in (d.content_disposition or "")


def test_listing_usage_and_delete(client: ScopefsClient, thread: str) -> None:
    client.workspace_write(thread, "docs/one.md", b"# one")
    client.workspace_write(thread, "docs/two.md", b"# two!")
    listing = client.workspace_list(thread, "docs")
    assert listing["path"] == "docs"
    assert sorted((e["name"], e["type"], e["size"]) for e in listing["entries"]) == [
        ("one.md", "file", 5),
        ("two.md", "file", 6),
    ]
    everything = client.workspace_list(thread, recursive=True)
    assert {"docs", "docs/one.md", "docs/two.md"} <= {e["path"] for e in everything["entries"]}
    usage = client.workspace_usage(thread)
    assert usage["files"] >= 2 and usage["bytes"] >= 11 and usage["quota"]["bytes"] > 0
    assert client.workspace_delete(thread, "docs/one.md") is None
    with pytest.raises(errors.NotFound):
        client.workspace_read(thread, "docs/one.md")
    with pytest.raises(errors.DirectoryNotEmpty):
        client.workspace_delete(thread, "docs")
    client.workspace_delete(thread, "docs", recursive=True)
    assert client.workspace_list(thread)["entries"] == []


def test_workspace_errors(client: ScopefsClient, thread: str) -> None:
    unknown = "thr_" + uuid.uuid4().hex
    with pytest.raises(errors.NotFound) as missing_thread:
        client.workspace_list(unknown)
    with pytest.raises(errors.NotFound) as missing_file:
        client.workspace_read(thread, "nothing-here.txt")
    # An unknown thread and a missing file look exactly alike (nothing about other scopes leaks).
    assert (missing_thread.value.status, missing_thread.value.message) == (
        missing_file.value.status,
        missing_file.value.message,
    )
    with pytest.raises(errors.InvalidThreadId):
        client.workspace_list("bad id")
    with pytest.raises(errors.InvalidPath):
        client.workspace_write(thread, "../escape.txt", b"x")
    client.workspace_write(thread, "adir/f.txt", b"x")
    with pytest.raises(errors.IsADirectory):
        client.workspace_read(thread, "adir")
    with pytest.raises(errors.InvalidLimit):
        client.workspace_imports(thread, limit=0)


def test_legacy_import_is_idempotent_on_its_key(client: ScopefsClient, thread: str) -> None:
    first = client.workspace_import(thread, source_path="reports/old.txt", idempotency_key="imp-1")
    again = client.workspace_import(thread, source_path="reports/old.txt", idempotency_key="imp-1")
    assert first["replayed"] is False and again["replayed"] is True
    assert first["path"] == "reports/old.txt" and first["sha256"] == again["sha256"]
    assert client.workspace_read(thread, "reports/old.txt") == b"from the legacy workspace\n"
    listed = client.workspace_imports(thread)
    assert [i["idempotency_key"] for i in listed["imports"]] == ["imp-1"] and listed["imports"][0][
        "state"
    ] == "completed"
    with pytest.raises(errors.FileExists):
        client.workspace_import(thread, source_path="reports/old.txt", idempotency_key="imp-2")
    with pytest.raises(errors.NotFound):
        client.workspace_import(thread, source_path="reports/missing.txt", idempotency_key="imp-3")
