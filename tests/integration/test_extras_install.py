"""`pip install .` with no extras, in a fresh virtual environment (no torch, no upstream wheel):
a serving command prints the one line that names the extra to install and exits non-zero with no
traceback, and `bench store --compare-upstream` says which extra brings upstream's wheel.

The environment is kept in the temp folder under a hash of pyproject.toml and setup.py (the
dependencies); each run reinstalls this tree into it without them. The first run takes minutes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "mooncake_cli", "backends")
pytestmark = pytest.mark.timeout(1200)


def _env() -> dict[str, str]:
    """This environment without what points Python at the tree or at another environment."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "MOONCAKE_PLUGINS")}


def _run(argv: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_env(),
                          cwd=cwd)


def _pip(python: Path, *args: str) -> None:
    done = _run([str(python), "-m", "pip", "install", "--quiet", *args], timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The bin folder of a virtual environment with this tree installed without extras."""
    key = hashlib.sha256(b"".join((ROOT / f).read_bytes() for f in SOURCES[:2])).hexdigest()
    venv = Path(tempfile.gettempdir()) / f"mooncake-bare-venv-{key[:16]}"
    python = venv / "bin" / "python"
    src = tmp_path_factory.mktemp("bare")  # a copy: the build writes beside its sources
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.so", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, src / name)
    for stale in venv.parent.glob("mooncake-bare-venv-*"):  # of an earlier pyproject.toml
        if stale != venv:
            shutil.rmtree(stale, ignore_errors=True)
    if not python.exists():
        shutil.rmtree(venv, ignore_errors=True)
        made = _run([sys.executable, "-m", "venv", str(venv)], timeout=300)
        assert made.returncode == 0, made.stderr
        _pip(python, str(src))  # the dependencies, once per pyproject.toml
    _pip(python, "--no-deps", "--force-reinstall", str(src))
    for absent in ("torch", "mooncake"):  # what this test is about: no extra is installed
        probe = _run([str(python), "-c", f"import importlib.util as u, sys; "
                      f"sys.exit(u.find_spec({absent!r}) is not None)"], timeout=60)
        assert probe.returncode == 0, f"{absent} is installed in {venv}"
    yield venv / "bin"


def test_a_serving_command_without_torch_names_the_extra(bare: Path, tmp_path: Path) -> None:
    done = _run([str(bare / "mooncake"), "conductor", "start", "--local", "1,1", "--model",
                 "demo"], timeout=300, cwd=tmp_path)
    assert done.returncode == 8, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.strip() == ("error: this command needs torch, which is not installed: "
                                   "pip install 'mooncake-cli[models]'")
    assert "Traceback" not in done.stdout + done.stderr


def test_compare_upstream_without_the_wheel_names_the_upstream_extra(bare: Path,
                                                                       tmp_path: Path) -> None:
    done = _run([str(bare / "mooncake"), "bench", "store", "--compare-upstream", "--sizes",
                 "4KiB", "--batches", "1", "--duration", "0.2", "--rounds", "1",
                 "--tensor-sizes", ""], timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("upstream skipped:")]
    assert "pip install 'mooncake-cli[upstream]'" in line


def test_the_packaged_trace_is_in_the_wheel(bare: Path, tmp_path: Path) -> None:
    """No --trace: the FAST'25 trace the wheel carries (mooncake_cli/data), wherever it runs."""
    done = _run([str(bare / "mooncake"), "--json", "bench", "trace", "--simulate", "--limit",
                 "100", "--prefill", "2", "--decode", "1", "--colocated", "-1"], timeout=300,
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["requests"] == 100
