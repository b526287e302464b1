#!/usr/bin/env python3
"""The README's quickstart, step 5: logs in to the daemon's admin page (``/admin/ui``) through its
login form, as a browser does, and prints the scopes page's row of thread THREAD's scope (default
``quickstart``) — what an operator sees there.

    python examples/admin_page.py [THREAD]

``SCOPEFS_URL`` (default ``http://127.0.0.1:7070``); the admin token ``SCOPEFS_ADMIN_TOKEN``, else
the file the daemon generated (``SCOPEFS_DATA_DIR``, default ``/var/lib/scopefs``,
``control/admin-token``; readable by root). In a browser: open the same address and paste the token.
"""

from __future__ import annotations

import html
import os
import re
import sys
from pathlib import Path

import httpx

from scopefs_client import ScopefsClient


def token(env: str, name: str) -> str:
    value = os.environ.get(env)
    if value:
        return value
    data_dir = Path(os.environ.get("SCOPEFS_DATA_DIR", "/var/lib/scopefs"))
    return (data_dir / "control" / name).read_text().strip()


def main() -> int:
    thread = sys.argv[1] if len(sys.argv) > 1 else "quickstart"
    url = os.environ.get("SCOPEFS_URL", "http://127.0.0.1:7070")
    with ScopefsClient(url, service_token=token("SCOPEFS_SERVICE_TOKEN", "service-token")) as c:
        scope_id = c.scope_by_thread(thread)["scope_id"]
    with httpx.Client(base_url=url, follow_redirects=True) as web:
        page = web.post("/admin/ui/login", data={"token": token("SCOPEFS_ADMIN_TOKEN", "admin-token")})
        page.raise_for_status()
        page = web.get("/admin/ui")
        page.raise_for_status()
    rows = [r for r in re.findall(r"<tr\b[^>]*>.*?</tr>", page.text, re.S) if scope_id in r]
    if not rows:
        print(f"the admin page does not list scope {scope_id}", file=sys.stderr)
        return 1
    cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td.*?</td>", rows[0], re.S)]
    print(f"{url}/admin/ui lists thread {thread}'s scope: " + " | ".join(c for c in cells if c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
