"""The installed package is fully typed: ``mypy --strict`` passes on it (through its ``py.typed``
marker, as a user's type checker sees it) and on ``examples/smoke.py``, which uses it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import scopefs_client


def test_mypy_strict_passes_on_the_installed_package_and_the_smoke_program(tmp_path: Path) -> None:
    package = Path(scopefs_client.__file__).resolve().parent
    smoke = Path(__file__).resolve().parents[1] / "examples" / "smoke.py"
    cmd = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), "-p", "scopefs_client"]
    checked = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert checked.returncode == 0, f"mypy --strict on {package.name}:\n{checked.stdout}{checked.stderr}"
    checked = subprocess.run(cmd[:-2] + [str(smoke)], capture_output=True, text=True, cwd=tmp_path)
    assert checked.returncode == 0, f"mypy --strict on examples/smoke.py:\n{checked.stdout}{checked.stderr}"
