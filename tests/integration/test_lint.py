"""The code base stays clean under ruff and mypy (both are test dependencies)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(300)
def test_ruff_is_clean() -> None:
    pytest.importorskip("ruff")  # run through the interpreter: works inside a venv too
    r = run(sys.executable, "-m", "ruff", "check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.timeout(300)
def test_mypy_is_clean() -> None:
    pytest.importorskip("mypy")
    r = run(sys.executable, "-m", "mypy", "mooncake_cli", "backends")
    assert r.returncode == 0, r.stdout + r.stderr
