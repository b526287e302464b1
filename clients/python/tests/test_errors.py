"""The exception table: one class per error code the daemon's source answers, unknown codes as the
base class, no body text or secret in any message; and money never as a float."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from scopefs_client import errors
from scopefs_client._core import amount_text

# Where the daemon names an error code (daemon/src, comments left out): `StatusCode::X, "code"`,
# `internal("code"`, `Forbidden("code"`, the file tools' `bad("code"` / `conflict("code"`, the
# `=> "code"` arms of api/error.rs, and the table of api/error/codes.rs (`Variant => "code": [..]`)
# where the daemon has one.
PATTERNS = [
    r'StatusCode::[A-Z_]+,\s*"([a-z][a-z_-]*)"',
    r'ApiError::internal\(\s*"([a-z_]+)"',
    r'Forbidden\(\s*"([a-z_]+)"',
    r'\b(?:bad|conflict)\(\s*"([a-z_]+)"',
    r'=> "([a-z][a-z_-]*)": \[',
]


def code_text(path: Path) -> str:
    """A Rust file without its comment lines."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("//"))


def daemon_codes(repo: Path) -> set[str]:
    src = repo / "daemon" / "src"
    found: set[str] = set()
    for path in src.rglob("*.rs"):
        text = code_text(path)
        for pattern in PATTERNS:
            found.update(re.findall(pattern, text))
    error_rs = code_text(src / "api" / "error.rs")
    found.update(re.findall(r'=> "([a-z][a-z_-]*)",', error_rs))
    return found


def test_every_error_code_of_the_daemon_has_its_own_class(repo: Path) -> None:
    codes = daemon_codes(repo)
    assert len(codes) > 60, "the scan found too few codes: its patterns no longer fit the daemon's source"
    missing = sorted(c for c in codes if c not in errors.CODE_CLASSES)
    assert not missing, f"error codes without an exception class: {missing}"
    for code, cls in errors.CODE_CLASSES.items():
        assert cls.code_name == code and issubclass(cls, errors.ScopefsError)
    assert len(set(errors.CODE_CLASSES.values())) == len(errors.CODE_CLASSES)


def answer(code: str, status: int, **extra: object) -> errors.ScopefsError:
    body = json.dumps({"error": {"code": code, "message": "m", **extra}}).encode()
    return errors.error_from_answer(status, body, {"retry-after": "2"}, method="GET", route="/api/workspace/file")


def test_an_answer_maps_to_the_class_of_its_code_with_its_details() -> None:
    e = answer("file_exists", 409, path_hint="x")
    assert type(e) is errors.FileExists and isinstance(e, errors.ConflictError)
    assert (e.status, e.code, e.message, e.details, e.retry_after) == (409, "file_exists", "m", {"path_hint": "x"}, 2.0)
    assert str(e) == "file_exists (HTTP 409) on GET /api/workspace/file: m"
    assert type(answer("compute_unavailable", 503)) is errors.ComputeUnavailable
    assert type(answer("cutover-in-progress", 503)) is errors.CutoverInProgress
    assert isinstance(answer("nonce_replayed", 401), errors.AuthenticationError)


def test_unknown_codes_and_foreign_bodies_are_the_base_class_without_their_text() -> None:
    e = answer("a_code_from_the_future", 418)
    assert type(e) is errors.ScopefsError and e.code == "a_code_from_the_future" and e.status == 418
    secret_page = b"<html>token=abcdef secret file content</html>"
    e = errors.error_from_answer(502, secret_page, {}, method="POST", route="/tools/read_file")
    assert type(e) is errors.ScopefsError and e.code is None and e.status == 502
    assert "abcdef" not in str(e) and "content" not in str(e)


def test_a_tools_call_that_reaches_nothing_is_compute_unavailable() -> None:
    assert issubclass(errors.ComputeUnreachable, errors.ComputeUnavailable)
    assert issubclass(errors.ComputeUnreachable, errors.ScopefsConnectionError)


def test_money_is_a_decimal_string_never_a_float() -> None:
    assert amount_text("1.000000") == "1.000000"
    assert amount_text(Decimal("2.5")) == "2.500000"
    assert amount_text(1_500_000) == "1.500000"
    with pytest.raises(TypeError):
        amount_text(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        amount_text(True)
