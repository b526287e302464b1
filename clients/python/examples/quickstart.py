#!/usr/bin/env python3
"""The README's quickstart, step 3: waits for the daemon, gives thread THREAD (default
``quickstart``) its scope, mounts it, writes ``hello.txt`` through the client and reads it back
through the host's mount.

    python examples/quickstart.py [THREAD]

The daemon's address is ``SCOPEFS_URL`` (default ``http://127.0.0.1:7070``); its service token
``SCOPEFS_SERVICE_TOKEN``, else the file the daemon generated (``SCOPEFS_DATA_DIR``, default
``/var/lib/scopefs``, ``control/service-token``; readable by root).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from scopefs_client import ScopefsClient


def service_token() -> str:
    token = os.environ.get("SCOPEFS_SERVICE_TOKEN")
    if token:
        return token
    data_dir = Path(os.environ.get("SCOPEFS_DATA_DIR", "/var/lib/scopefs"))
    return (data_dir / "control" / "service-token").read_text().strip()


def main() -> int:
    thread = sys.argv[1] if len(sys.argv) > 1 else "quickstart"
    url = os.environ.get("SCOPEFS_URL", "http://127.0.0.1:7070")
    deadline = time.monotonic() + 600  # the first start builds nothing, but may recover scopes
    with ScopefsClient(url, service_token=service_token()) as c:
        while not c.ready():
            if time.monotonic() > deadline:
                print(f"scopefs at {url} is not ready", file=sys.stderr)
                return 1
            time.sleep(0.5)
        scope = c.provision(thread, operation_id=f"quickstart-{thread}")
        mount = c.mount_scope(scope["scope_id"])
        c.workspace_write(thread, "hello.txt", b"hello from the Python client\n")
        host = Path(mount["mountpoint"]) / "hello.txt"
        print(f"thread {thread}: scope {scope['scope_id']} ({scope['state']})")
        print(f"mounted at {mount['mountpoint']}; {host.name} through the mount: {host.read_text()!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
