"""The signer against seed 003 §4.4's golden vector — the one the daemon's own test
(tests/tools_signing.rs) and the seed's reference script (tests/sign_bodies.py) hold — and
differentially against that script on generated bodies."""

from __future__ import annotations

import importlib.util
import json
import random
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from scopefs_client import signing

# Seed 003 §4.4, verbatim.
SEED_SECRET = "test-hmac-secret-for-unit-tests-only"
SEED_CANONICAL_JSON = (
    '{"auth_context":{"issued_at":1716500000,"nonce":"abc123def456","object_scope":{"read":["objects/in/data.csv"],'
    '"write_prefixes":["jobs/job_1/artifacts/"]},"user_id":"test_user"},"command":"echo hello",'
    '"environment_id":"env_test123"}'
)
SEED_PAYLOAD_HASH = "45957f2078d85c7c09bedfea3f000b6a42a8e01e039250644bb577321186035b"
SEED_CANONICAL_REPR = (
    "'POST\\n/tools/execute_command\\n1716500000\\nabc123def456\\n"
    "45957f2078d85c7c09bedfea3f000b6a42a8e01e039250644bb577321186035b'"
)
SEED_TOKEN = "06af87716e9c3ba83441362dad2faa543c5db19d1c47fb937cd2ffe29cee1d21"
PATH = "/tools/execute_command"


def rust_golden(repo: Path) -> dict[str, Any]:
    """GOLDEN_SECRET, GOLDEN_TOKEN, GOLDEN_ISSUED_AT and golden_body() of tests/tools_signing.rs."""
    text = (repo / "tests" / "tools_signing.rs").read_text(encoding="utf-8")
    secret = re.search(r'const GOLDEN_SECRET: &str = "([^"]+)";', text)
    token = re.search(r'const GOLDEN_TOKEN: &str = "([0-9a-f]+)";', text)
    issued = re.search(r"const GOLDEN_ISSUED_AT: i64 = (\d+);", text)
    body = re.search(r'fn golden_body\(token: &str\) -> String \{\s*format!\(\s*r#"(.*?)"#', text, re.S)
    assert secret and token and issued and body, "tests/tools_signing.rs no longer holds the golden vector"
    template = body.group(1).replace("{{", "{").replace("}}", "}")
    return {
        "secret": secret.group(1),
        "token": token.group(1),
        "issued_at": int(issued.group(1)),
        "body": json.loads(template.replace("{token}", token.group(1))),
    }


def seed_script(repo: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("sign_bodies", repo / "tests" / "sign_bodies.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def golden_params() -> dict[str, Any]:
    return {"command": "echo hello", "environment_id": "env_test123"}


def golden_scope() -> dict[str, Any]:
    return {"read": ["objects/in/data.csv"], "write_prefixes": ["jobs/job_1/artifacts/"]}


def test_each_stage_of_the_seed_golden_vector() -> None:
    body = {
        "auth_context": {
            "user_id": "test_user",
            "issued_at": 1716500000,
            "nonce": "abc123def456",
            "object_scope": golden_scope(),
        },
        **golden_params(),
    }
    assert signing.canonical_json(body) == SEED_CANONICAL_JSON
    assert signing.payload_hash(body) == SEED_PAYLOAD_HASH
    canonical = signing.canonical_string("post", PATH, 1716500000, "abc123def456", SEED_PAYLOAD_HASH)
    assert repr(canonical) == SEED_CANONICAL_REPR
    assert canonical.count("\n") == 4 and not canonical.endswith("\n")
    assert signing.sign(SEED_SECRET, canonical) == SEED_TOKEN


def test_the_signer_reproduces_the_daemon_tests_golden_body(repo: Path) -> None:
    golden = rust_golden(repo)
    assert (golden["secret"], golden["token"], golden["issued_at"]) == (SEED_SECRET, SEED_TOKEN, 1716500000)
    built = signing.signed_body(
        golden["secret"],
        "POST",
        PATH,
        golden_params(),
        user_id="test_user",
        thread_id=None,
        object_scope=golden_scope(),
        issued_at=golden["issued_at"],
        nonce="abc123def456",
    )
    assert built == golden["body"]
    assert built["auth_context"]["token"] == SEED_TOKEN
    assert signing.verify(SEED_SECRET, "POST", PATH, golden["body"])


def test_any_change_to_the_body_route_or_secret_changes_the_token(repo: Path) -> None:
    golden = rust_golden(repo)["body"]
    assert not signing.verify(SEED_SECRET, "POST", "/tools/list_dir", golden)
    assert not signing.verify(SEED_SECRET + "x", "POST", PATH, golden)
    changed = json.loads(json.dumps(golden))
    changed["command"] = "echo hellp"
    assert not signing.verify(SEED_SECRET, "POST", PATH, changed)
    added = {**golden, "timeout_seconds": 5}
    assert not signing.verify(SEED_SECRET, "POST", PATH, added)
    removed = {k: v for k, v in golden.items() if k != "environment_id"}
    assert not signing.verify(SEED_SECRET, "POST", PATH, removed)
    crlf = signing.canonical_string("POST", PATH, 1716500000, "abc123def456", SEED_PAYLOAD_HASH).replace("\n", "\r\n")
    assert signing.sign(SEED_SECRET, crlf) != SEED_TOKEN


def test_every_signature_gets_a_fresh_nonce() -> None:
    nonces = {
        signing.signed_body("s", "POST", PATH, {}, user_id="u", thread_id="t")["auth_context"]["nonce"]
        for _ in range(50)
    }
    assert len(nonces) == 50
    assert all(re.fullmatch(r"[0-9a-f]{32}", n) for n in nonces)
    with pytest.raises(ValueError):
        signing.signed_body("s", "POST", PATH, {"auth_context": {}}, user_id="u", thread_id="t")


def test_the_signer_agrees_with_the_seed_reference_script_on_generated_bodies(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = seed_script(repo)
    monkeypatch.setattr(script.time, "time", lambda: 1716500123.9)
    r = random.Random(25)
    for i in range(200):
        params = {script.rand_string(r, 12): script.rand_value(r, 0, True) for _ in range(r.randint(0, 6))}
        params.pop("auth_context", None)
        scope = {"read": [script.rand_string(r)], "write_prefixes": ["/workspace"]} if i % 2 else None
        nonce = "%032x" % r.getrandbits(128)
        want = script.build_body(
            "secret-" + str(i), "POST", PATH, params, user_id="u", thread_id="thr_x", object_scope=scope, nonce=nonce
        )
        got = signing.signed_body(
            "secret-" + str(i),
            "POST",
            PATH,
            params,
            user_id="u",
            thread_id="thr_x",
            object_scope=scope,
            issued_at=1716500123,
            nonce=nonce,
        )
        assert got["auth_context"]["token"] == want["auth_context"]["token"], params
        assert signing.canonical_json(got) == signing.canonical_json(want)
