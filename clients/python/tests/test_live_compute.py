"""The compute tools (``/tools/*``, Docker) against the live daemon: environments, commands,
background processes, destroy with artifacts — and the main errors as their classes."""

from __future__ import annotations

import time
import uuid

import pytest

from conftest import Live
from scopefs_client import ScopefsClient, errors


def test_an_environment_from_create_to_destroy(client: ScopefsClient, thread: str) -> None:
    env = client.create_environment(thread, default_output_paths=["/workspace/out"])
    eid = env["environment_id"]
    assert env["status"] == "running" and env["execution_mode"] == "standard"
    assert [e["environment_id"] for e in client.list_environments(thread)["environments"]] == [eid]
    assert client.get_environment_status(thread, eid)["state"] == "running"

    out = client.execute_command(thread, eid, "mkdir -p /workspace/out && echo made > /workspace/out/r.txt && echo hi")
    assert (out["exit_code"], out["stdout"], out["timed_out"]) == (0, "hi\n", False)
    failed = client.execute_command(thread, eid, "exit 3")
    assert failed["exit_code"] == 3
    # What the command wrote is the workspace's, seen by the file tools.
    assert client.read_file(thread, "out/r.txt")["content"] == "made\n"

    proc = client.start_process(thread, "echo started; sleep 300", environment_id=eid)
    pid = proc["process_id"]
    assert any(p["process_id"] == pid for p in client.list_processes(thread, environment_id=eid)["processes"])
    deadline = time.monotonic() + 60
    while True:
        checked = client.check_process(thread, pid)
        if "started" in checked["log_tail"]:
            break
        assert time.monotonic() < deadline, f"the process never logged: {checked}"
        time.sleep(0.05)  # between polls, not a wait for the outcome
    stopped = client.stop_process(thread, pid)
    assert stopped["process_id"] == pid and stopped["state"] != "running"

    done = client.destroy_environment(thread, eid)
    assert done["already_ended"] is False
    assert [(a["path"], a["size_bytes"]) for a in done["artifacts"]] == [("/workspace/out/r.txt", 5)]
    again = client.destroy_environment(thread, eid)
    assert again["already_ended"] is True
    with pytest.raises(errors.EnvironmentNotRunning) as ended:
        client.execute_command(thread, eid, "true")
    assert ended.value.status == 409


def test_compute_errors(client: ScopefsClient, thread: str) -> None:
    with pytest.raises(errors.EnvironmentNotFound) as missing:
        client.execute_command(thread, "env_does_not_exist", "true")
    assert missing.value.status == 404
    with pytest.raises(errors.EnvironmentNotFound):
        client.get_environment_status(thread, "env_does_not_exist")
    with pytest.raises(errors.ProcessNotFound):
        client.check_process(thread, "proc_does_not_exist")
    with pytest.raises(errors.ImageNotAllowed) as image:
        client.create_environment(thread, image_ref="some/other:image")
    assert image.value.status == 403
    with pytest.raises(errors.InvalidRequest):
        client.create_environment(thread, not_a_seed_field=True)


def test_only_the_creating_thread_may_end_an_environment(client: ScopefsClient, live: Live, thread: str) -> None:
    env = client.create_environment(thread)["environment_id"]
    try:
        # A second thread acting in the same scope (an async thread owner) may not end it...
        scope = client.scope_by_thread(thread)["scope_id"]
        helper = "thr_async_" + uuid.uuid4().hex
        client.create_owner(scope, owner_type="async_thread", resource_id=helper)
        with pytest.raises(errors.NotOwner) as refused:
            client.destroy_environment(helper, env)
        assert refused.value.status == 403
        # ...and a thread of another scope does not even see it.
        other = "thr_other_" + uuid.uuid4().hex
        client.provision(other, user_id=live.user)
        with pytest.raises(errors.EnvironmentNotFound):
            client.destroy_environment(other, env)
    finally:
        client.destroy_environment(thread, env)
