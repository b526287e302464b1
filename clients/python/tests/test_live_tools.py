"""The signed file tools (``/tools/*``) against the live daemon: success, the signature's refusals
(wrong secret, replayed nonce, expired), object_scope, and the main errors as their classes."""

from __future__ import annotations

import hashlib
import uuid

import httpx
import pytest

from conftest import Live
from scopefs_client import ScopefsClient, decode_download, errors, signing


def test_file_tools_round_trip(client: ScopefsClient, thread: str) -> None:
    written = client.write_file(thread, "notes/a.txt", "hello\nworld\n")
    assert written["path"] == "/workspace/notes/a.txt" and written["size_bytes"] == 12
    read = client.read_file(thread, "/workspace/notes/a.txt")
    assert (read["content"], read["size_bytes"]) == ("hello\nworld\n", 12)
    edit = client.edit_file(thread, "notes/a.txt", "world", "there")
    assert edit["replacements"] == 1 and "-world" in edit["diff"] and "+there" in edit["diff"]
    assert client.read_file(thread, "notes/a.txt")["content"] == "hello\nthere\n"
    listing = client.list_dir(thread, "/workspace/notes")
    assert [(e["name"], e["type"]) for e in listing["entries"]] == [("a.txt", "file")]
    grep = client.grep_files(thread, "^th", "/workspace")
    assert [(m["path"], m["line_number"]) for m in grep["matches"]] == [("/workspace/notes/a.txt", 2)]
    assert client.glob_files(thread, "**/*.txt")["matches"] == ["/workspace/notes/a.txt"]
    data = bytes(range(256)) * 40
    up = client.upload_file(thread, "bin/blob", data)
    assert up["size_bytes"] == len(data)
    down = client.download_file(thread, "bin/blob")
    assert down["sha256"] == hashlib.sha256(data).hexdigest() and decode_download(down) == data


def test_file_tool_errors(client: ScopefsClient, thread: str) -> None:
    with pytest.raises(errors.FileNotFound) as missing:
        client.read_file(thread, "nope.txt")
    assert missing.value.status == 404
    client.write_file(thread, "e.txt", "aaa")
    with pytest.raises(errors.OldStringNotFound):
        client.edit_file(thread, "e.txt", "zzz", "y")
    with pytest.raises(errors.OldStringNotUnique):
        client.edit_file(thread, "e.txt", "a", "b")
    with pytest.raises(errors.InvalidPath):
        client.read_file(thread, "../../etc/passwd")
    with pytest.raises(errors.InvalidPattern):
        client.grep_files(thread, "(unclosed")
    with pytest.raises(errors.Sha256Mismatch):
        client.tool(
            "upload_file",
            thread,
            {"remote_path": "x.bin", "content_base64": "aGVsbG8=", "sha256": "0" * 64},
        )
    client.upload_file(thread, "b.bin", b"\xff\xfe")
    with pytest.raises(errors.NotUtf8):
        client.read_file(thread, "b.bin")
    with pytest.raises(errors.InvalidRequest):
        client.tool("read_file", thread, {"path": "e.txt", "unknown_field": 1})
    with pytest.raises(errors.ScopeNotFound):
        client.read_file("thr_" + uuid.uuid4().hex, "a.txt")


def test_object_scope_bounds_the_request(client: ScopefsClient, thread: str) -> None:
    client.write_file(thread, "open/a.txt", "a")
    client.write_file(thread, "closed/b.txt", "b")
    scope = {"read": ["/workspace/open"], "write_prefixes": ["/workspace/open"]}
    assert client.read_file(thread, "open/a.txt", object_scope=scope)["content"] == "a"
    with pytest.raises(errors.ObjectScopeDenied) as denied:
        client.read_file(thread, "closed/b.txt", object_scope=scope)
    assert denied.value.status == 403
    with pytest.raises(errors.ObjectScopeDenied):
        client.write_file(thread, "closed/c.txt", "c", object_scope=scope)


def test_the_daemon_refuses_bad_signatures_replays_and_stale_times(live: Live, thread: str) -> None:
    with ScopefsClient(live.url, hmac_secret="not-the-secret", user_id=live.user) as wrong:
        with pytest.raises(errors.InvalidSignature) as bad:
            wrong.list_dir(thread)
    assert bad.value.status == 401 and "not-the-secret" not in str(bad.value)

    path = "/tools/list_dir"
    body = signing.signed_body(
        live.hmac_secret, "POST", path, {"path": "/workspace"}, user_id=live.user, thread_id=thread
    )
    first = httpx.post(live.url + path, json=body)
    assert first.status_code == 200
    replay = httpx.post(live.url + path, json=body)
    e = errors.error_from_answer(replay.status_code, replay.content, replay.headers, method="POST", route=path)
    assert type(e) is errors.NonceReplayed and e.status == 401

    stale = signing.signed_body(
        live.hmac_secret,
        "POST",
        path,
        {"path": "/workspace"},
        user_id=live.user,
        thread_id=thread,
        issued_at=1716500000,
    )
    old = httpx.post(live.url + path, json=stale)
    e = errors.error_from_answer(old.status_code, old.content, old.headers, method="POST", route=path)
    assert type(e) is errors.SignatureExpired


def test_a_client_signed_call_is_accepted_once_per_nonce(client: ScopefsClient, thread: str) -> None:
    # Each call signs afresh: the same read twice is two nonces, both accepted.
    client.write_file(thread, "twice.txt", "x")
    assert client.read_file(thread, "twice.txt")["content"] == "x"
    assert client.read_file(thread, "twice.txt")["content"] == "x"
