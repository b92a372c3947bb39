"""The suite fails on a skip the host's hardware does not explain (conftest's
pytest_sessionfinish with tests/helpers/skips.py): run on a probe module in a child pytest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import skips

REPO = Path(__file__).resolve().parents[2]
PROBE = '''import pytest

def test_hardware() -> None:
    pytest.skip("needs a CUDA device")

def test_setup_missed() -> None:
    pytest.skip("the `etcd` binary is not on PATH")

def test_runs() -> None:
    pass
'''


def test_only_unexplained_skips_are_reported() -> None:
    got = skips.unexpected([("a", "needs a CUDA device"), ("b", "etcd is not on PATH"),
                            ("c", skips.reason_of(("f.py", 3, "Skipped: an RDMA device: x")))])
    assert got == ["b: etcd is not on PATH"]


def test_an_unexpected_skip_fails_the_run(tmp_path: Path) -> None:
    probe = REPO / "tests" / f"test_probe_{tmp_path.name}.py"
    probe.write_text(PROBE, encoding="utf-8")
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              str(probe)], capture_output=True, text=True, cwd=REPO,
                             timeout=120)
        hardware_only = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
             "not setup_missed", str(probe)], capture_output=True, text=True, cwd=REPO,
            timeout=120)
    finally:
        probe.unlink()
    assert run.returncode == 1, run.stdout
    assert "1 skip(s) not expected" in run.stdout
    assert "test_setup_missed: the `etcd` binary is not on PATH" in run.stdout
    assert "test_hardware" not in run.stdout.split("not expected")[1].split("short test")[0]
    assert hardware_only.returncode == 0, hardware_only.stdout
