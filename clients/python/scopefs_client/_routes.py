"""Every non-streamed route of the scopefs API, defined once for both clients.

Each method builds a :class:`~scopefs_client._core.Call` and hands it to ``self._run``: the sync
client returns the answer, the async client a coroutine of it. The type parameters say which:
``JsonT`` is what a JSON answer gives (``Json`` or ``Awaitable[Json]``), ``BoolT``, ``TextT`` and
``NoneT`` likewise for ``/ready``, ``/metrics`` and answers without a body.

Which calls are retried (``idempotent=True``): GETs; the ``/tools/*`` calls that change nothing
(reads, listings, status) and ``destroy_environment`` ("again is harmless"); the POSTs the API
makes idempotent by a key (provision, fork: ``operation_id``; snapshots: ``snapshot_id``; run
reservations: ``run_request_id``; owners with a ``resource_id``; lease acquisition by its
``operation_id``; legacy imports and credits: ``idempotency_key``), and the admin calls the API
documents as idempotent (``mark-settled``, ``mark-artifacts-registered``) or that only read
(``pending-usage``). Everything else is sent once.
"""

from __future__ import annotations

import base64
import hashlib
from decimal import Decimal
from typing import Any, Generic, Mapping, Optional, Sequence, TypeVar, Union, cast

from ._core import Answer, Auth, Call, Tool, amount_text, drop_none, new_key, query

JsonT = TypeVar("JsonT")
BoolT = TypeVar("BoolT")
TextT = TypeVar("TextT")
NoneT = TypeVar("NoneT")

SCOPE = "/internal/workspace-scopes/{scope_id}"

#: Seconds a create may take (seed 003 §4.6: 210 s).
CREATE_TIMEOUT = 210.0
#: Seconds added to a command's own timeout for its answer to arrive (seed 003 §4.6).
COMMAND_SLACK = 5.0
#: A command's timeout when the call names none: the daemon's default ``executor.command_timeout_secs``.
DEFAULT_COMMAND_TIMEOUT = 600


class _Base(Generic[JsonT, BoolT, TextT, NoneT]):
    def _run(self, call: Call) -> Any:
        raise NotImplementedError

    def _json(self, call: Call) -> JsonT:
        return cast(JsonT, self._run(call))


class PublicRoutes(_Base[JsonT, BoolT, TextT, NoneT]):
    """``/health``, ``/ready``, ``/openapi.json`` and ``/metrics``."""

    def health(self) -> JsonT:
        """Liveness: ``{"status": "ok"}``."""
        return self._json(Call("GET", "/health", Auth.PUBLIC, idempotent=True))

    def ready(self) -> BoolT:
        """Readiness: ``True`` on 200, ``False`` on 503 ``not_ready`` or when the daemon cannot be reached."""
        return cast(BoolT, self._run(Call("GET", "/ready", Auth.PUBLIC, answer=Answer.READY, timeout=5.0)))

    def openapi(self) -> JsonT:
        """The daemon's OpenAPI document."""
        return self._json(Call("GET", "/openapi.json", Auth.PUBLIC, idempotent=True))

    def metrics(self) -> TextT:
        """Prometheus metrics text (service token)."""
        return cast(TextT, self._run(Call("GET", "/metrics", Auth.SERVICE, idempotent=True, answer=Answer.TEXT)))


class InternalRoutes(_Base[JsonT, BoolT, TextT, NoneT]):
    """``/internal/*``: scopes, owners, run reservations, leases, forks and snapshots (service token)."""

    def provision(
        self,
        thread_id: str,
        *,
        operation_id: Optional[str] = None,
        user_id: Optional[str] = None,
        lease_operation_id: Optional[str] = None,
        new_thread: bool = False,
    ) -> JsonT:
        """Create (or return) the draft scope of a primary thread; idempotent on ``operation_id``."""
        body = drop_none(
            {
                "operation_id": operation_id or new_key("provision"),
                "primary_thread_id": thread_id,
                "user_id": user_id,
                "lease_operation_id": lease_operation_id,
                "new_thread": new_thread or None,
            }
        )
        return self._json(
            Call("POST", "/internal/workspace-scopes/provision", Auth.SERVICE, json=body, idempotent=True)
        )

    def record_cutover_report(self) -> JsonT:
        """Record the configured migration report as the deployment's cutover operation."""
        return self._json(Call("POST", "/internal/workspace-cutover/report", Auth.SERVICE))

    def scope_by_thread(self, thread_id: str) -> JsonT:
        """The scope of a primary thread, with its usage."""
        route = "/internal/workspace-scopes/by-thread/{thread_id}"
        return self._json(Call("GET", route, Auth.SERVICE, {"thread_id": thread_id}, idempotent=True))

    def update_scope(self, scope_id: str, *, expected_revision: int, state: str) -> JsonT:
        """Revision compare-and-set of a scope's state (``active`` or ``deleting``)."""
        body = {"expected_revision": expected_revision, "state": state}
        return self._json(Call("PATCH", SCOPE, Auth.SERVICE, {"scope_id": scope_id}, json=body))

    def mount_scope(self, scope_id: str) -> JsonT:
        """Where a scope is mounted (mounting it if needed): host paths for an orchestrator."""
        return self._json(Call("GET", SCOPE + "/mount", Auth.SERVICE, {"scope_id": scope_id}, idempotent=True))

    def collect_garbage(self, scope_id: str) -> JsonT:
        """Online garbage collection of a scope now."""
        return self._json(Call("POST", SCOPE + "/gc", Auth.SERVICE, {"scope_id": scope_id}))

    def create_owner(
        self,
        scope_id: str,
        *,
        owner_type: str,
        resource_id: Optional[str] = None,
        parent_owner_id: Optional[str] = None,
        lease_operation_id: Optional[str] = None,
    ) -> JsonT:
        """Register an owner (idempotent, and retried, when it names its ``resource_id``)."""
        body = drop_none(
            {
                "owner_type": owner_type,
                "resource_id": resource_id,
                "parent_owner_id": parent_owner_id,
                "lease_operation_id": lease_operation_id,
            }
        )
        keyed = resource_id is not None
        return self._json(
            Call("POST", SCOPE + "/owners", Auth.SERVICE, {"scope_id": scope_id}, json=body, idempotent=keyed)
        )

    def update_owner(
        self,
        scope_id: str,
        owner_id: str,
        *,
        expected_revision: Optional[int] = None,
        resource_id: Optional[str] = None,
        state: Optional[str] = None,
    ) -> JsonT:
        """Attach a resource id and/or change an owner's state."""
        body = drop_none({"expected_revision": expected_revision, "resource_id": resource_id, "state": state})
        params = {"scope_id": scope_id, "owner_id": owner_id}
        return self._json(Call("PATCH", SCOPE + "/owners/{owner_id}", Auth.SERVICE, params, json=body))

    def owner_by_resource(self, scope_id: str, resource_id: str, *, owner_type: Optional[str] = None) -> JsonT:
        """The owner of an external resource in a scope."""
        params = {"scope_id": scope_id, "resource_id": resource_id}
        route = SCOPE + "/owners/by-resource/{resource_id}"
        return self._json(Call("GET", route, Auth.SERVICE, params, query=query(owner_type=owner_type), idempotent=True))

    def reserve_run(
        self,
        scope_id: str,
        *,
        run_request_id: str,
        turn_id: str,
        request_hash: str,
        interrupt_key: Optional[str] = None,
    ) -> JsonT:
        """Idempotent run reservation (on ``run_request_id``)."""
        body = drop_none(
            {
                "run_request_id": run_request_id,
                "turn_id": turn_id,
                "request_hash": request_hash,
                "interrupt_key": interrupt_key,
            }
        )
        params = {"scope_id": scope_id}
        return self._json(Call("POST", SCOPE + "/runs/reserve", Auth.SERVICE, params, json=body, idempotent=True))

    def update_run(
        self, scope_id: str, run_request_id: str, *, run_id: Optional[str] = None, state: Optional[str] = None
    ) -> JsonT:
        """Attach a run id and/or change a run request's state."""
        params = {"scope_id": scope_id, "run_request_id": run_request_id}
        body = drop_none({"run_id": run_id, "state": state})
        return self._json(Call("PATCH", SCOPE + "/runs/{run_request_id}", Auth.SERVICE, params, json=body))

    def acquire_lease(self, lock_name: str, *, operation_id: str, ttl_seconds: int) -> JsonT:
        """Acquire a lease (granted again to the operation that holds it: idempotent)."""
        body = {"operation_id": operation_id, "ttl_seconds": ttl_seconds}
        route = "/internal/leases/{lock_name}"
        return self._json(Call("POST", route, Auth.SERVICE, {"lock_name": lock_name}, json=body, idempotent=True))

    def renew_lease(self, lock_name: str, *, operation_id: str, ttl_seconds: int) -> JsonT:
        """Renew a lease its holder still holds."""
        body = {"operation_id": operation_id, "ttl_seconds": ttl_seconds}
        return self._json(
            Call("PATCH", "/internal/leases/{lock_name}", Auth.SERVICE, {"lock_name": lock_name}, json=body)
        )

    def release_lease(self, lock_name: str, *, operation_id: str) -> JsonT:
        """Release a lease: ``{"released": bool}``."""
        route = "/internal/leases/{lock_name}"
        q = query(operation_id=operation_id)
        return self._json(Call("DELETE", route, Auth.SERVICE, {"lock_name": lock_name}, query=q))

    def fork_scope(
        self,
        scope_id: str,
        *,
        primary_thread_id: str,
        operation_id: Optional[str] = None,
        user_id: Optional[str] = None,
    ) -> JsonT:
        """Fork a scope into a new scope of another thread; idempotent on ``operation_id``."""
        body = drop_none(
            {
                "operation_id": operation_id or new_key("fork"),
                "primary_thread_id": primary_thread_id,
                "user_id": user_id,
            }
        )
        return self._json(
            Call("POST", SCOPE + "/fork", Auth.SERVICE, {"scope_id": scope_id}, json=body, idempotent=True)
        )

    def create_snapshot(self, scope_id: str, snapshot_id: str) -> JsonT:
        """Record a read-only point in time of a scope; idempotent on ``snapshot_id``."""
        body = {"snapshot_id": snapshot_id}
        params = {"scope_id": scope_id}
        return self._json(Call("POST", SCOPE + "/snapshots", Auth.SERVICE, params, json=body, idempotent=True))

    def list_snapshots(self, scope_id: str) -> JsonT:
        """A scope's snapshots, oldest first."""
        return self._json(Call("GET", SCOPE + "/snapshots", Auth.SERVICE, {"scope_id": scope_id}, idempotent=True))

    def restore_snapshot(self, scope_id: str, snapshot_id: str) -> JsonT:
        """Make a scope's files a snapshot's."""
        params = {"scope_id": scope_id, "snapshot_id": snapshot_id}
        return self._json(Call("POST", SCOPE + "/snapshots/{snapshot_id}/restore", Auth.SERVICE, params))


class WorkspaceRoutes(_Base[JsonT, BoolT, TextT, NoneT]):
    """The ``/api/workspace*`` routes without streamed bodies (service token)."""

    def workspace_list(
        self, thread_id: str, path: str = "", *, recursive: bool = False, snapshot_id: Optional[str] = None
    ) -> JsonT:
        """List a workspace directory."""
        q = query(threadId=thread_id, path=path, recursive="1" if recursive else None, snapshotId=snapshot_id)
        return self._json(Call("GET", "/api/workspace", Auth.SERVICE, query=q, idempotent=True))

    def workspace_delete(self, thread_id: str, path: str, *, recursive: bool = False) -> NoneT:
        """Delete a file (``recursive`` for a directory)."""
        q = query(threadId=thread_id, path=path, recursive="1" if recursive else None)
        return cast(NoneT, self._run(Call("DELETE", "/api/workspace/file", Auth.SERVICE, query=q, answer=Answer.EMPTY)))

    def workspace_usage(self, thread_id: str) -> JsonT:
        """File count, bytes and quota of a workspace."""
        q = query(threadId=thread_id)
        return self._json(Call("GET", "/api/workspace/usage", Auth.SERVICE, query=q, idempotent=True))

    def workspace_import(
        self,
        thread_id: str,
        *,
        source_path: str,
        idempotency_key: Optional[str] = None,
        target_path: Optional[str] = None,
        overwrite: bool = False,
    ) -> JsonT:
        """Copy one file from the legacy workspace; idempotent on ``idempotency_key``."""
        body = drop_none(
            {
                "source_path": source_path,
                "target_path": target_path,
                "idempotency_key": idempotency_key or new_key("import"),
                "overwrite": overwrite or None,
            }
        )
        q = query(threadId=thread_id)
        return self._json(Call("POST", "/api/workspace/import", Auth.SERVICE, query=q, json=body, idempotent=True))

    def workspace_imports(self, thread_id: str, *, after: Optional[str] = None, limit: Optional[int] = None) -> JsonT:
        """A page of the thread's legacy imports."""
        q = query(threadId=thread_id, after=after, limit=limit)
        return self._json(Call("GET", "/api/workspace/imports", Auth.SERVICE, query=q, idempotent=True))


class AdminRoutes(_Base[JsonT, BoolT, TextT, NoneT]):
    """``/admin/*`` (``X-Admin-Token``): usage, settlement, accounts, audit log, nodes. Money is a
    decimal string (``"1.000000"``), a ``Decimal`` or integer micro-units — never a float."""

    def nodes(self) -> JsonT:
        """The nodes of the deployment."""
        return self._json(Call("GET", "/admin/nodes", Auth.ADMIN, idempotent=True))

    def pending_usage(self, *, settled: int = 0, limit: Optional[int] = None) -> JsonT:
        """Usage records with their artifacts: pending (``settled=0``) or settled (``1``)."""
        body = drop_none({"settled": settled, "limit": limit})
        return self._json(Call("POST", "/admin/pending-usage", Auth.ADMIN, json=body, idempotent=True))

    def mark_settled(self, usage_ids: Sequence[int]) -> JsonT:
        """Settle usage records (each is charged at most once: idempotent)."""
        body = {"usage_ids": list(usage_ids)}
        return self._json(Call("POST", "/admin/mark-settled", Auth.ADMIN, json=body, idempotent=True))

    def mark_artifacts_registered(
        self,
        *,
        environment_id: Optional[str] = None,
        usage_id: Optional[int] = None,
        usage_ids: Optional[Sequence[int]] = None,
    ) -> JsonT:
        """Mark artifacts registered (idempotent); give exactly one selector."""
        body = drop_none(
            {
                "environment_id": environment_id,
                "usage_id": usage_id,
                "usage_ids": list(usage_ids) if usage_ids is not None else None,
            }
        )
        return self._json(Call("POST", "/admin/mark-artifacts-registered", Auth.ADMIN, json=body, idempotent=True))

    def account(self, user_id: str) -> JsonT:
        """An account: plan, compute minutes, cash balance (decimal strings)."""
        route = "/admin/accounts/{user_id}"
        return self._json(Call("GET", route, Auth.ADMIN, {"user_id": user_id}, idempotent=True))

    def credit(
        self,
        user_id: str,
        amount: Union[str, Decimal, int],
        *,
        idempotency_key: Optional[str] = None,
        note: Optional[str] = None,
    ) -> JsonT:
        """Credit cash; idempotent on ``idempotency_key`` (the same key again answers the first entry)."""
        body = drop_none(
            {"amount": amount_text(amount), "idempotency_key": idempotency_key or new_key("credit"), "note": note}
        )
        route = "/admin/accounts/{user_id}/credit"
        return self._json(Call("POST", route, Auth.ADMIN, {"user_id": user_id}, json=body, idempotent=True))

    def set_plan(self, user_id: str, plan: str) -> JsonT:
        """Set an account's plan."""
        route = "/admin/accounts/{user_id}/plan"
        return self._json(Call("PUT", route, Auth.ADMIN, {"user_id": user_id}, json={"plan": plan}))

    def set_quota_adjustment(self, user_id: str, minutes: int) -> JsonT:
        """Set an account's compute quota adjustment (minutes, may be negative)."""
        route = "/admin/accounts/{user_id}/quota-adjustment"
        return self._json(Call("PUT", route, Auth.ADMIN, {"user_id": user_id}, json={"minutes": minutes}))

    def ledger(self, user_id: str, *, limit: Optional[int] = None, before: Optional[int] = None) -> JsonT:
        """Wallet ledger entries, newest first."""
        route = "/admin/accounts/{user_id}/ledger"
        q = query(limit=limit, before=before)
        return self._json(Call("GET", route, Auth.ADMIN, {"user_id": user_id}, query=q, idempotent=True))

    def audit_log(self, *, limit: Optional[int] = None, before: Optional[int] = None) -> JsonT:
        """The admin audit log, newest first."""
        q = query(limit=limit, before=before)
        return self._json(Call("GET", "/admin/audit-log", Auth.ADMIN, query=q, idempotent=True))


class ToolRoutes(_Base[JsonT, BoolT, TextT, NoneT]):
    """``/tools/*``, signed (seed 003 §4.3): the file tools and the compute tools. Every call acts
    as ``thread_id`` of ``user_id`` (the client's default user unless given), optionally bounded by a
    signed ``object_scope``."""

    def tool(
        self,
        name: str,
        thread_id: str,
        params: Optional[Mapping[str, Any]] = None,
        *,
        user_id: Optional[str] = None,
        object_scope: Optional[Mapping[str, Any]] = None,
        idempotent: bool = False,
        timeout: Optional[float] = None,
    ) -> JsonT:
        """Any ``/tools/<name>`` call. ``idempotent=True`` lets it be retried (each try re-signed)."""
        tool = Tool(thread_id=thread_id, params=dict(params or {}), user_id=user_id, object_scope=object_scope)
        call = Call("POST", f"/tools/{name}", Auth.SIGNED, tool=tool, idempotent=idempotent, timeout=timeout)
        return self._json(call)

    def _tool(self, name: str, thread_id: str, params: Mapping[str, Any], kw: Mapping[str, Any], **opts: Any) -> JsonT:
        return self.tool(name, thread_id, drop_none(params), **kw, **opts)

    # files

    def read_file(self, thread_id: str, path: str, *, environment_id: Optional[str] = None, **kw: Any) -> JsonT:
        """A UTF-8 text file: ``{path, content, size_bytes}``."""
        return self._tool("read_file", thread_id, {"path": path, "environment_id": environment_id}, kw, idempotent=True)

    def write_file(
        self, thread_id: str, path: str, content: str, *, environment_id: Optional[str] = None, **kw: Any
    ) -> JsonT:
        """Write a text file (atomic replace, parents created)."""
        params = {"path": path, "content": content, "environment_id": environment_id}
        return self._tool("write_file", thread_id, params, kw)

    def edit_file(
        self,
        thread_id: str,
        path: str,
        old_string: str,
        new_string: str,
        *,
        replace_all: bool = False,
        environment_id: Optional[str] = None,
        **kw: Any,
    ) -> JsonT:
        """Replace a unique ``old_string`` (or every one with ``replace_all``); answers the diff."""
        params = {
            "path": path,
            "old_string": old_string,
            "new_string": new_string,
            "replace_all": replace_all or None,
            "environment_id": environment_id,
        }
        return self._tool("edit_file", thread_id, params, kw)

    def list_dir(
        self, thread_id: str, path: str = "/workspace", *, environment_id: Optional[str] = None, **kw: Any
    ) -> JsonT:
        """One directory's entries."""
        return self._tool("list_dir", thread_id, {"path": path, "environment_id": environment_id}, kw, idempotent=True)

    def grep_files(
        self,
        thread_id: str,
        pattern: str,
        path: str = "/workspace",
        *,
        glob: Optional[str] = None,
        environment_id: Optional[str] = None,
        **kw: Any,
    ) -> JsonT:
        """Lines matching a regular expression in files below ``path``."""
        params = {"pattern": pattern, "path": path, "glob": glob, "environment_id": environment_id}
        return self._tool("grep_files", thread_id, params, kw, idempotent=True)

    def glob_files(
        self, thread_id: str, pattern: str, path: str = "/workspace", *, environment_id: Optional[str] = None, **kw: Any
    ) -> JsonT:
        """Paths matching a glob pattern."""
        params = {"pattern": pattern, "path": path, "environment_id": environment_id}
        return self._tool("glob_files", thread_id, params, kw, idempotent=True)

    def upload_file(
        self, thread_id: str, remote_path: str, data: bytes, *, environment_id: Optional[str] = None, **kw: Any
    ) -> JsonT:
        """Write ``data`` (sent as base64 with its SHA-256, which the daemon checks)."""
        params = {
            "remote_path": remote_path,
            "content_base64": base64.b64encode(data).decode("ascii"),
            "sha256": hashlib.sha256(data).hexdigest(),
            "environment_id": environment_id,
        }
        return self._tool("upload_file", thread_id, params, kw)

    def download_file(
        self, thread_id: str, remote_path: str, *, environment_id: Optional[str] = None, **kw: Any
    ) -> JsonT:
        """A file as ``{path, content_base64, sha256, size_bytes}`` (see :func:`decode_download`)."""
        params = {"remote_path": remote_path, "environment_id": environment_id}
        return self._tool("download_file", thread_id, params, kw, idempotent=True)

    # compute

    def create_environment(self, thread_id: str, *, timeout: Optional[float] = CREATE_TIMEOUT, **fields: Any) -> JsonT:
        """Create a sandbox environment; ``fields`` are seed 003 §4.5's (``execution_mode``,
        ``input_objects``, ``default_output_paths``, ``limits``, ...), plus ``user_id`` and
        ``object_scope`` for the signature."""
        kw = {k: fields.pop(k) for k in ("user_id", "object_scope") if k in fields}
        return self._tool("create_environment", thread_id, fields, kw, timeout=timeout)

    def destroy_environment(
        self,
        thread_id: str,
        environment_id: str,
        *,
        persist_outputs: Optional[bool] = None,
        output_paths: Optional[Sequence[str]] = None,
        force_destroy: Optional[bool] = None,
        artifact_prefix: Optional[str] = None,
        **kw: Any,
    ) -> JsonT:
        """Destroy an environment; its outputs become artifacts. Again is harmless (retried)."""
        params = {
            "environment_id": environment_id,
            "persist_outputs": persist_outputs,
            "output_paths": list(output_paths) if output_paths is not None else None,
            "force_destroy": force_destroy,
            "artifact_prefix": artifact_prefix,
        }
        return self._tool("destroy_environment", thread_id, params, kw, idempotent=True, timeout=60.0)

    def list_environments(self, thread_id: str, **kw: Any) -> JsonT:
        """The scope's environments."""
        return self._tool("list_environments", thread_id, {}, kw, idempotent=True)

    def get_environment_status(self, thread_id: str, environment_id: str, **kw: Any) -> JsonT:
        """One environment's state, runtime and end reason."""
        params = {"environment_id": environment_id}
        return self._tool("get_environment_status", thread_id, params, kw, idempotent=True)

    def execute_command(
        self,
        thread_id: str,
        environment_id: str,
        command: str,
        *,
        timeout_seconds: Optional[int] = None,
        max_output_bytes: Optional[int] = None,
        **kw: Any,
    ) -> JsonT:
        """Run a command in an environment (never retried, never run locally)."""
        params = {
            "environment_id": environment_id,
            "command": command,
            "timeout_seconds": timeout_seconds,
            "max_output_bytes": max_output_bytes,
        }
        wait = (DEFAULT_COMMAND_TIMEOUT if timeout_seconds is None else timeout_seconds) + COMMAND_SLACK
        return self._tool("execute_command", thread_id, params, kw, timeout=wait)

    def start_process(self, thread_id: str, command: str, *, environment_id: Optional[str] = None, **kw: Any) -> JsonT:
        """Start a background process."""
        return self._tool("start_process", thread_id, {"command": command, "environment_id": environment_id}, kw)

    def check_process(self, thread_id: str, process_id: str, *, tail_bytes: Optional[int] = None, **kw: Any) -> JsonT:
        """A background process's state, exit code and log tail."""
        params = {"process_id": process_id, "tail_bytes": tail_bytes}
        return self._tool("check_process", thread_id, params, kw, idempotent=True)

    def stop_process(self, thread_id: str, process_id: str, **kw: Any) -> JsonT:
        """Kill a background process."""
        return self._tool("stop_process", thread_id, {"process_id": process_id}, kw)

    def list_processes(self, thread_id: str, *, environment_id: Optional[str] = None, **kw: Any) -> JsonT:
        """The scope's background processes."""
        return self._tool("list_processes", thread_id, {"environment_id": environment_id}, kw, idempotent=True)


class Routes(
    PublicRoutes[JsonT, BoolT, TextT, NoneT],
    InternalRoutes[JsonT, BoolT, TextT, NoneT],
    WorkspaceRoutes[JsonT, BoolT, TextT, NoneT],
    AdminRoutes[JsonT, BoolT, TextT, NoneT],
    ToolRoutes[JsonT, BoolT, TextT, NoneT],
):
    """Every route family."""


def decode_download(answer: Mapping[str, Any]) -> bytes:
    """The bytes of a ``download_file`` answer, checked against its SHA-256."""
    data = base64.b64decode(answer["content_base64"], validate=True)
    if hashlib.sha256(data).hexdigest() != str(answer["sha256"]).lower():
        raise ValueError("downloaded content does not match its sha256")
    return data
