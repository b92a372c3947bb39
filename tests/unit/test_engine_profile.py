"""`mooncake bench profile`: a profile.json the conductor's cost model reads, and bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mooncake_cli.app import app
from mooncake_cli.scheduler.costmodel import PROFILE_SCHEMA, load_profile

pytestmark = pytest.mark.timeout(120)
runner = CliRunner()
SMALL = ["--lengths", "16,32,64", "--cached", "0,0.5", "--batches", "1,4",
         "--contexts", "16,48", "--repeats", "1", "--block-size", "8"]


@pytest.fixture(autouse=True)
def _no_mooncake_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("MOONCAKE_"):
            monkeypatch.delenv(key)


def mooncake(*args: str) -> Any:
    return runner.invoke(app, list(args), prog_name="mooncake")


def test_profile_writes_the_conductor_schema(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    result = mooncake("--json", "bench", "profile", "--model", "demo", *SMALL, "-o", str(path))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    doc = json.loads(path.read_text())
    assert doc["schema"] == PROFILE_SCHEMA and "meaningless" in doc["model"]
    assert doc["block_tokens"] == 8
    assert doc["kv_bytes_per_token"] == 4 * 2 * 2 * 32 * 4  # layers, K+V, kv heads, dim, fp32
    assert {(s["input_tokens"], s["cached_tokens"]) for s in doc["prefill"]} == {
        (16, 0), (16, 8), (32, 0), (32, 16), (64, 0), (64, 32)}
    assert sorted(s["batch"] for s in doc["decode"]) == [1, 1, 4, 4]
    assert all(s["seconds"] > 0 for s in doc["prefill"] + doc["decode"])
    held = {(s["input_tokens"], s["cached_tokens"]) for s in doc["held_out"]["prefill"]}
    assert held == {(23, 0), (45, 8)}  # midway lengths and cached fraction (0.25)
    assert [s["batch"] for s in doc["held_out"]["decode"]] == [2]
    model = load_profile(str(path))  # the conductor reads it and fits the same coefficients
    assert doc["fit"] == {k: getattr(model, k) for k in doc["fit"]}
    for row in report["held_out"]:
        assert row["error"] == pytest.approx(abs(row["predicted_s"] - row["measured_s"])
                                             / row["measured_s"])
    assert report["fit_error"]["all"]["max"] == max(r["error"] for r in report["held_out"])


@pytest.mark.parametrize("args,words", [
    (["--lengths", "16,x"], ["--lengths", "comma-separated integers"]),
    (["--lengths", "16,32"], ["at least 3 lengths"]),
    (["--cached", "0,1.5"], ["--cached", "[0, 1)"]),
    (["--model", "/nonexistent/model"], ["no such file or directory"]),
    (["--dtype", "int8"], ["dtype"]),
])
def test_profile_bad_input(args: list[str], words: list[str], tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    result = mooncake("bench", "profile", *args, "-o", str(out))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for w in words:
        assert w in result.output
    assert not out.exists()
