"""`mooncake bench scheduler`: one row per cluster size from the shipped trace, every timed
decision the reference's with --check, the figure, and one-line errors for bad input. Checks
are on structure, never on timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mooncake_cli.app import app
from mooncake_cli.commands.bench_plot import FIGURES

runner = CliRunner()


def test_rows_per_size_checked_against_the_reference(tmp_path: Path) -> None:
    png = tmp_path / "scheduler.png"
    res = runner.invoke(app, ["--json", "bench", "scheduler", "--instances", "20,60",
                              "--requests", "40", "--warmup", "5", "--check", "--policy",
                              "cache-aware", "--plot", str(png)], prog_name="mooncake")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["policy"] == "cache-aware" and rep["trace_requests"] == 12031
    assert [r["instances"] for r in rep["rows"]] == [20, 60]
    for r in rep["rows"]:
        assert r["decisions"] == 40 and r["agree_with_reference"] == r["checked"] == 45
        assert 0 < r["p50_us"] <= r["p99_us"] <= r["max_us"]
        assert r["most_holders"] == r["instances"]  # the trace's first block: everywhere
        assert r["distinct_keys"] == 182790 and r["index_entries"] >= r["distinct_keys"]
        assert r["bytes_per_entry"] > 0 and r["bytes_per_key"] > r["bytes_per_entry"]
    assert rep["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = FIGURES["scheduler"](rep)
    assert [ax.get_title() for ax in fig.axes] == ["decision time (prefill + decode)",
                                                   "prefix index memory"]


@pytest.mark.parametrize("args,match", [
    (["--instances", "0"], "--instances"), (["--instances", "ten"], "--instances"),
    (["--policy", "fastest"], "unknown policy"), (["--check", "--policy", "random"], "--check"),
    (["--requests", "0"], "--requests"), (["--trace", "/nonexistent.jsonl"], "does not exist"),
])
def test_bad_input_is_one_line(args: list[str], match: str) -> None:
    res = runner.invoke(app, ["bench", "scheduler", *args], prog_name="mooncake")
    assert res.exit_code == 2 and match in res.output, res.output
    assert "Traceback" not in res.output
