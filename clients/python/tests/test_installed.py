"""The suite runs against the installed package (the harness's venv), which ships its type marker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import scopefs_client


def test_the_package_under_test_is_the_pip_installed_one() -> None:
    venv = os.environ.get("SCOPEFS_CLIENT_TEST_VENV")
    if not venv:
        pytest.fail("SCOPEFS_CLIENT_TEST_VENV is not set: run `cargo test --test clients_python`")
    package = Path(scopefs_client.__file__).resolve().parent
    assert Path(venv).resolve() in package.parents, f"imported from {package}, not from the venv"
    assert (package / "py.typed").is_file()
    assert scopefs_client.__version__ == "0.1.0"
