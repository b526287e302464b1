"""``/internal/*`` and the public routes against the live daemon: scopes, owners, runs, leases,
forks and snapshots — success, idempotent replays, and the main errors as their classes."""

from __future__ import annotations

import uuid

import pytest

from conftest import Live
from scopefs_client import ScopefsClient, errors


def tid() -> str:
    return "thr_" + uuid.uuid4().hex


def test_public_routes(client: ScopefsClient) -> None:
    assert client.health() == {"status": "ok"}
    assert client.ready() is True
    doc = client.openapi()
    assert "/tools/execute_command" in doc["paths"] and "/internal/workspace-scopes/provision" in doc["paths"]
    assert "scopefs_" in client.metrics()


def test_provision_is_idempotent_on_its_operation_id(client: ScopefsClient, live: Live) -> None:
    t = tid()
    first = client.provision(t, operation_id="op-" + t, user_id=live.user)
    again = client.provision(t, operation_id="op-" + t, user_id=live.user)
    assert first["created"] is True and again["created"] is False
    assert first["scope_id"] == again["scope_id"] and first["state"] == "draft"
    found = client.scope_by_thread(t)
    assert found["scope_id"] == first["scope_id"] and "usage" in found
    with pytest.raises(errors.ScopeNotFound) as missing:
        client.scope_by_thread(tid())
    assert missing.value.status == 404
    with pytest.raises(errors.InvalidThreadId):
        client.provision("bad thread id/with slash")


def test_scope_state_changes_by_revision(client: ScopefsClient) -> None:
    t = tid()
    scope = client.provision(t)
    with pytest.raises(errors.RevisionConflict):
        client.update_scope(scope["scope_id"], expected_revision=scope["revision"] + 5, state="active")
    active = client.update_scope(scope["scope_id"], expected_revision=scope["revision"], state="active")
    assert active["state"] == "active" and active["revision"] > scope["revision"]
    with pytest.raises(errors.InvalidScopeId):
        client.update_scope("not-a-scope-id", expected_revision=1, state="active")
    mount = client.mount_scope(scope["scope_id"])
    assert mount["scope_id"] == scope["scope_id"] and mount["mountpoint"] and mount["bind_source"]
    gc = client.collect_garbage(scope["scope_id"])
    assert {"blocks_deleted", "bytes_deleted", "blocks_deferred"} <= gc.keys()


def test_owners_and_run_reservations(client: ScopefsClient) -> None:
    scope = client.provision(tid())["scope_id"]
    job = "job-" + uuid.uuid4().hex
    owner = client.create_owner(scope, owner_type="cron", resource_id=job)
    again = client.create_owner(scope, owner_type="cron", resource_id=job)
    assert owner["created"] is True and again["created"] is False and owner["owner_id"] == again["owner_id"]
    assert client.owner_by_resource(scope, job, owner_type="cron")["owner_id"] == owner["owner_id"]
    with pytest.raises(errors.OwnerNotFound):
        client.owner_by_resource(scope, "no-such-job")
    active = client.update_owner(scope, owner["owner_id"], state="active")
    assert active["state"] == "active"

    run = client.reserve_run(scope, run_request_id="run-1", turn_id="turn-1", request_hash="h1")
    replay = client.reserve_run(scope, run_request_id="run-1", turn_id="turn-1", request_hash="h1")
    assert run["created"] is True and replay["created"] is False and run["state"] == "reserved"
    with pytest.raises(errors.IdempotencyKeyConflict) as conflict:
        client.reserve_run(scope, run_request_id="run-1", turn_id="turn-1", request_hash="other")
    assert conflict.value.status == 409
    run_id = "r-" + uuid.uuid4().hex
    started = client.update_run(scope, "run-1", run_id=run_id, state="started")
    assert started["state"] == "started" and started["run_id"] == run_id
    with pytest.raises(errors.RunRequestNotFound):
        client.update_run(scope, "run-missing", state="started")


def test_leases(client: ScopefsClient) -> None:
    name = "lock-" + uuid.uuid4().hex[:12]
    lease = client.acquire_lease(name, operation_id="op-a", ttl_seconds=60)
    assert lease["operation_id"] == "op-a"
    assert client.acquire_lease(name, operation_id="op-a", ttl_seconds=60)["operation_id"] == "op-a"
    with pytest.raises(errors.LeaseHeld):
        client.acquire_lease(name, operation_id="op-b", ttl_seconds=60)
    assert client.renew_lease(name, operation_id="op-a", ttl_seconds=120)["operation_id"] == "op-a"
    with pytest.raises(errors.LeaseNotHeld):
        client.renew_lease(name, operation_id="op-b", ttl_seconds=60)
    assert client.release_lease(name, operation_id="op-a") == {"released": True}


def test_snapshots_and_forks(client: ScopefsClient) -> None:
    t = tid()
    scope = client.provision(t)["scope_id"]
    client.workspace_write(t, "keep.txt", b"version one")
    name = "snap-" + uuid.uuid4().hex
    snap = client.create_snapshot(scope, name)
    assert snap["snapshot_id"] == name and snap["scope_id"] == scope
    assert client.create_snapshot(scope, name)["snapshot_id"] == name
    with pytest.raises(errors.InvalidRequest):
        client.create_snapshot(scope, "out.reserved")
    assert [s["snapshot_id"] for s in client.list_snapshots(scope)["snapshots"]] == [name]
    client.workspace_write(t, "keep.txt", b"version two")
    assert client.workspace_read(t, "keep.txt", snapshot_id=name) == b"version one"
    restored = client.restore_snapshot(scope, name)
    assert restored["scope_id"] == scope
    assert client.workspace_read(t, "keep.txt") == b"version one"

    child = tid()
    fork = client.fork_scope(scope, primary_thread_id=child, operation_id="fork-" + child)
    assert fork["created"] is True and fork["forked_from"] == scope
    assert client.fork_scope(scope, primary_thread_id=child, operation_id="fork-" + child)["created"] is False
    assert client.workspace_read(child, "keep.txt") == b"version one"
    with pytest.raises(errors.ScopeNotFound):
        client.list_snapshots(str(uuid.uuid4()))


def test_the_service_token_is_required(live: Live) -> None:
    with ScopefsClient(live.url, service_token="wrong-token") as wrong:
        with pytest.raises(errors.Unauthorized) as caught:
            wrong.scope_by_thread(tid())
        with pytest.raises(errors.Unauthorized):
            wrong.metrics()
    assert caught.value.status == 401 and "wrong-token" not in str(caught.value)
    with ScopefsClient(live.url) as anonymous:
        with pytest.raises(ValueError):
            anonymous.workspace_usage(tid())


def test_the_cutover_report_without_one_configured(client: ScopefsClient) -> None:
    with pytest.raises(errors.MigrationRequired) as caught:
        client.record_cutover_report()
    assert (caught.value.status, caught.value.code) == (409, "migration-required")
