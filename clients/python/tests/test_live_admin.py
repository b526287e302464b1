"""``/admin/*`` against the live daemon: accounts (plan, quota adjustment, credit with its
idempotency key, ledger), the audit log, nodes, and the usage of an environment from pending to
settled — with the main errors as their classes. Money stays decimal strings."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest

from conftest import Live
from scopefs_client import ScopefsClient, errors


def test_accounts_credit_and_ledger(client: ScopefsClient) -> None:
    user = "acct_" + uuid.uuid4().hex[:12]
    with pytest.raises(errors.AccountNotFound) as missing:
        client.account(user)
    assert missing.value.status == 404
    credited = client.credit(user, "2.500000", idempotency_key="k-" + user, note="test")
    assert credited["entry"]["amount"] == "2.500000" and credited["account"]["plan"] == "pro"
    replay = client.credit(user, "2.500000", idempotency_key="k-" + user)
    assert replay["entry"] == credited["entry"]
    with pytest.raises(errors.IdempotencyKeyConflict):
        client.credit(user, Decimal("3"), idempotency_key="k-" + user)
    client.credit(user, 1_000_000, idempotency_key="k2-" + user)
    account = client.account(user)
    assert Decimal(account["cash_balance"]) == Decimal("3.5")
    assert client.set_plan(user, "metered")["plan"] == "metered"
    with pytest.raises(errors.UnknownPlan):
        client.set_plan(user, "no-such-plan")
    adjusted = client.set_quota_adjustment(user, 30)
    assert adjusted["compute_quota_adjustment"] == 30
    ledger = client.ledger(user, limit=10)["entries"]
    assert [e["amount"] for e in ledger] == ["1.000000", "2.500000"]
    with pytest.raises(errors.InvalidRequest):
        client.ledger(user, limit=0)
    audit = client.audit_log(limit=50)["entries"]
    assert any(e["action"] == "credit" and user in e["subject"] for e in audit)
    assert "nodes" in client.nodes()


def test_the_admin_token_is_required(live: Live) -> None:
    with ScopefsClient(live.url, admin_token="wrong-admin") as wrong:
        with pytest.raises(errors.Unauthorized) as caught:
            wrong.pending_usage()
    assert "wrong-admin" not in str(caught.value)


def test_usage_from_pending_to_settled(client: ScopefsClient, live: Live, thread: str) -> None:
    client.set_plan(live.user, "metered")
    client.credit(live.user, "5.000000", idempotency_key="usage-" + thread)
    env = client.create_environment(thread, default_output_paths=["/workspace/res"])["environment_id"]
    client.execute_command(thread, env, "mkdir -p /workspace/res && echo 42 > /workspace/res/answer.txt")
    done = client.destroy_environment(thread, env)
    assert [a["path"] for a in done["artifacts"]] == ["/workspace/res/answer.txt"]

    pending = client.pending_usage(settled=0, limit=500)["usage"]
    record = next(r for r in pending if r["environment_id"] == env)
    assert record["artifacts_registered"] is False and "answer.txt" in record["output_manifest_json"]
    assert client.mark_settled([record["id"]])["results"] == [{"usage_id": record["id"], "status": "artifacts_pending"}]
    assert client.mark_artifacts_registered(environment_id=env) == {"updated": 1}
    with pytest.raises(errors.InvalidRequest):
        client.mark_artifacts_registered()
    with pytest.raises(errors.UsageNotFound):
        client.mark_artifacts_registered(environment_id="env_never_was")

    assert client.mark_settled([record["id"]])["results"][0]["status"] == "settled"
    assert client.mark_settled([record["id"]])["results"][0]["status"] == "already_settled"
    assert client.mark_settled([987654321])["results"][0]["status"] == "not_found"
    charges = [e for e in client.ledger(live.user)["entries"] if e["source_id"] == env]
    assert len(charges) == 1, charges
    charge = charges[0]
    assert charge["compute_minutes"] >= 1 and Decimal(charge["amount"]) > 0
    assert Decimal(client.account(live.user)["cash_balance"]) <= Decimal(charge["balance_after"])
    settled = client.pending_usage(settled=1, limit=500)["usage"]
    assert any(r["id"] == record["id"] for r in settled)
    assert all(r["id"] != record["id"] for r in client.pending_usage(settled=0, limit=500)["usage"])
