#!/usr/bin/env python3
"""Seed 003 §16.3's smoke test — the steps that concern scopefs — run with scopefs_client only.

 1. store probe: a put/get/delete round trip through the workspace API
 2. GET /ready answers 200
 3. a small CSV uploaded into the thread's files (streamed multipart)
 4. the input manifest built for it (object key, size, SHA-256 of what the daemon holds)
 5. create_environment, standard (a dedicated container), on a metered account with credit
 6. python --version inside it
 7. write/read a file with the file tools, and python reading the uploaded CSV
 8. destroy_environment persisting an output artifact
 9. pending usage lists the environment with its artifact manifest; the artifacts registered
10. settlement: mark-settled charges the environment once, a ledger row records it
11. mark-settled again finds it settled; pending usage no longer lists it, settled usage does
12. with the execution side stopped, compute calls raise ComputeUnavailable and nothing runs
    locally (the program asks for the stop on stdout and waits for a line on stdin)

Each step prints ``step K/12 <name>: ok``, or ``step K/12 <name>: FAILED: <why>`` and the program
exits 1. The daemon is named by the environment: SCOPEFS_URL, SCOPEFS_SERVICE_TOKEN,
SCOPEFS_ADMIN_TOKEN, SCOPEFS_HMAC_SECRET and SCOPEFS_SMOKE_USER (or the SCOPEFS_CLIENT_TEST_*
variables the test harness sets). Secrets, file contents and command output are never printed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Optional

from scopefs_client import ComputeUnavailable, ScopefsClient, ScopefsError, errors

CSV = b"name,score\nada,3\nbob,5\n"
STEPS = 12


class StepFailed(Exception):
    """A step's check did not hold."""


def check(ok: bool, why: str) -> None:
    if not ok:
        raise StepFailed(why)


def env(name: str) -> str:
    for key in (f"SCOPEFS_{name}", f"SCOPEFS_CLIENT_TEST_{name}"):
        value = os.environ.get(key)
        if value:
            return value
    raise SystemExit(f"smoke: set SCOPEFS_{name}")


class Smoke:
    def __init__(self, client: ScopefsClient, user: str) -> None:
        self.c = client
        self.user = user
        self.thread = "thr_smoke_" + uuid.uuid4().hex
        self.manifest: list[dict[str, Any]] = []
        self.env_id = ""
        self.usage_id = 0

    # 1-2
    def store_probe(self) -> None:
        self.c.provision(self.thread, user_id=self.user)
        name = ".smoke-probe-" + uuid.uuid4().hex
        payload = os.urandom(4096)
        self.c.workspace_write(self.thread, name, payload)
        check(self.c.workspace_read(self.thread, name) == payload, "the probe read back differs")
        self.c.workspace_delete(self.thread, name)
        try:
            self.c.workspace_read(self.thread, name)
        except errors.NotFound:
            return
        raise StepFailed("the probe was still there after its delete")

    def ready(self) -> None:
        check(self.c.ready() is True, "GET /ready did not answer 200")

    # 3-4
    def upload_csv(self) -> None:
        answer = self.c.workspace_upload(self.thread, {"data.csv": CSV})
        check([f["path"] for f in answer["files"]] == ["data.csv"], "the upload answered other files")
        listed = {e["path"]: e["size"] for e in self.c.workspace_list(self.thread)["entries"]}
        check(listed.get("data.csv") == len(CSV), "data.csv is not listed with its size")

    def input_manifest(self) -> None:
        held = hashlib.sha256()
        size = 0
        with self.c.workspace_stream(self.thread, "data.csv") as d:
            for chunk in d.iter_bytes():
                held.update(chunk)
                size += len(chunk)
        check(held.hexdigest() == hashlib.sha256(CSV).hexdigest(), "the stored CSV differs from the upload")
        self.manifest = [
            {
                "file_id": "file_1",
                "object_key": f"threads/{self.thread}/files/data.csv",
                "sha256": held.hexdigest(),
                "size_bytes": size,
                "mount_path": "/workspace/data.csv",
                "read_only": True,
            }
        ]

    # 5-8
    def create_environment(self) -> None:
        self.c.set_plan(self.user, "metered")
        self.c.credit(self.user, "1.000000", idempotency_key="smoke-" + self.thread)
        created = self.c.create_environment(
            self.thread,
            execution_mode="standard",
            resource_class="small",
            shared_compute_eligible=False,
            backend_policy="auto",
            input_objects=self.manifest,
            artifact_prefix=f"jobs/{self.thread}/req_1/artifacts/",
            default_output_paths=["/workspace/out"],
            max_runtime_seconds=300,
            limits={"max_stdout_stderr_bytes": 1048576, "max_files": 100},
        )
        check(created["execution_mode"] == "standard", "the environment is not standard")
        check(created["status"] == "running", "the environment is not running")
        self.env_id = created["environment_id"]

    def python_version(self) -> None:
        out = self.c.execute_command(self.thread, self.env_id, "python --version")
        said = (out.get("stdout") or "") + (out.get("stderr") or "")
        check(out["exit_code"] == 0, f"python --version exited {out['exit_code']}")
        check(said.startswith("Python 3."), "python --version did not name Python 3")

    def write_read(self) -> None:
        self.c.write_file(self.thread, "notes.txt", "smoke")
        check(self.c.read_file(self.thread, "notes.txt")["content"] == "smoke", "notes.txt read back differs")
        count = "python -c \"import csv; print(sum(1 for _ in csv.DictReader(open('/workspace/data.csv'))))\""
        out = self.c.execute_command(self.thread, self.env_id, count)
        check(out["exit_code"] == 0 and out["stdout"].strip() == "2", "python did not count the CSV's two rows")

    def destroy(self) -> None:
        make = (
            'mkdir -p /workspace/out && python -c "import json; '
            "json.dump({'rows': 2}, open('/workspace/out/summary.json', 'w'))\""
        )
        out = self.c.execute_command(self.thread, self.env_id, make)
        check(out["exit_code"] == 0, f"writing the output exited {out['exit_code']}")
        done = self.c.destroy_environment(self.thread, self.env_id)
        arts = done["artifacts"]
        check(len(arts) == 1, f"{len(arts)} artifacts instead of 1")
        check(arts[0]["path"] == "/workspace/out/summary.json", "the artifact has another path")
        check(arts[0]["object_key"] == f"threads/{self.thread}/files/out/summary.json", "unexpected object key")
        check(str(arts[0].get("artifact_id", "")).startswith("art_"), "the artifact has no art_ id")

    # 9-11
    def pending_record(self, settled: int) -> Optional[dict[str, Any]]:
        usage = self.c.pending_usage(settled=settled, limit=500)["usage"]
        return next((r for r in usage if r["environment_id"] == self.env_id), None)

    def register(self) -> None:
        record = self.pending_record(0)
        check(record is not None, "no pending usage for the environment")
        assert record is not None
        self.usage_id = record["id"]
        check(record["artifacts_registered"] is False, "the artifacts were registered already")
        manifest = json.loads(record["output_manifest_json"] or "[]")
        check([a["path"] for a in manifest] == ["/workspace/out/summary.json"], "the manifest lacks the artifact")
        check(self.c.mark_artifacts_registered(environment_id=self.env_id)["updated"] == 1, "nothing was marked")
        again = self.pending_record(0)
        check(again is not None and again["artifacts_registered"] is True, "the registration did not stick")

    def charges(self) -> list[dict[str, Any]]:
        return [e for e in self.c.ledger(self.user, limit=500)["entries"] if e.get("source_id") == self.env_id]

    def settle(self) -> None:
        status = self.c.mark_settled([self.usage_id])["results"][0]["status"]
        check(status == "settled", f"mark-settled answered {status}")
        rows = self.charges()
        check(len(rows) == 1, f"{len(rows)} ledger rows for the environment instead of 1")
        check(rows[0]["compute_minutes"] >= 1, "the ledger row charges no minutes")

    def mark_settled(self) -> None:
        status = self.c.mark_settled([self.usage_id])["results"][0]["status"]
        check(status == "already_settled", f"marking again answered {status}")
        check(self.pending_record(0) is None, "pending usage still lists the environment")
        check(self.pending_record(1) is not None, "settled usage does not list the environment")
        check(len(self.charges()) == 1, "a second charge appeared")

    # 12
    def compute_unavailable(self) -> None:
        print("smoke: stop the execution side now, then press Enter", flush=True)
        sys.stdin.readline()
        check(self.c.ready() is False, "the execution side still answers /ready")
        marker = os.path.join(tempfile.gettempdir(), "scopefs-smoke-" + uuid.uuid4().hex)
        started = time.monotonic()
        calls: list[tuple[str, Callable[[], object]]] = [
            ("execute_command", lambda: self.c.execute_command(self.thread, self.env_id, f"touch {marker}")),
            ("create_environment", lambda: self.c.create_environment(self.thread)),
            ("start_process", lambda: self.c.start_process(self.thread, f"touch {marker}")),
        ]
        for name, call in calls:
            try:
                call()
            except ComputeUnavailable:
                pass
            else:
                raise StepFailed(f"{name} did not raise ComputeUnavailable")
        check(not os.path.exists(marker), "a command ran locally")
        check(time.monotonic() - started < 60, "the client did not give up promptly")


def main() -> int:
    user = os.environ.get("SCOPEFS_SMOKE_USER") or os.environ.get("SCOPEFS_CLIENT_TEST_USER") or "smoke_user"
    with ScopefsClient(
        env("URL"),
        service_token=env("SERVICE_TOKEN"),
        admin_token=env("ADMIN_TOKEN"),
        hmac_secret=env("HMAC_SECRET"),
        user_id=user,
    ) as client:
        s = Smoke(client, user)
        steps: list[tuple[str, Callable[[], None]]] = [
            ("store probe", s.store_probe),
            ("ready", s.ready),
            ("upload a small CSV", s.upload_csv),
            ("build the input manifest", s.input_manifest),
            ("create_environment standard", s.create_environment),
            ("python --version", s.python_version),
            ("write/read a file", s.write_read),
            ("destroy persisting an artifact", s.destroy),
            ("pending usage with its artifact manifest, registered", s.register),
            ("settlement with a ledger row", s.settle),
            ("mark-settled", s.mark_settled),
            ("execution side stopped: ComputeUnavailable, nothing run locally", s.compute_unavailable),
        ]
        assert len(steps) == STEPS
        for k, (name, step) in enumerate(steps, start=1):
            try:
                step()
            except (StepFailed, ScopefsError, KeyError, ValueError) as e:
                print(f"step {k}/{STEPS} {name}: FAILED: {type(e).__name__}: {e}", flush=True)
                return 1
            print(f"step {k}/{STEPS} {name}: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
