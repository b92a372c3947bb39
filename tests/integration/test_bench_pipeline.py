"""`mooncake bench pipeline`, run small through the CLI: three real `mooncake prefill` processes
(smollm2-135m), a 600-token prompt of real text prefilled by one instance and as a pipeline of
2 and 3 stages. Every pipelined answer ran as a pipeline (no fallback), split the layers evenly
and gave the single instance's first token; the report and its figure have their shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mooncake_cli.app import app
from mooncake_cli.commands.bench_plot import FIGURES

pytestmark = pytest.mark.timeout(600)
PNG = b"\x89PNG\r\n\x1a\n"


def test_pipelined_prefills_give_the_single_instance_token_and_are_reported(
        tmp_path: Path) -> None:
    png = tmp_path / "pipeline.png"
    res = CliRunner().invoke(app, ["--json", "bench", "pipeline", "--tokens", "600",
                                   "--stages", "1,2,3", "--repeat", "1", "--chunk", "256",
                                   "--plot", str(png)])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["layers"] == 30 and rep["threads"] == 1 and rep["chunk_tokens"] == 256
    assert rep["prompt_source"] and rep["corpus_tokens"] > 600
    assert rep["host"]["cores"] >= 1 and len(rep["host"]["load_after"]) == 3
    assert [(r["tokens"], r["stages"]) for r in rep["rows"]] == [(600, 1), (600, 2), (600, 3)]
    single, two, three = rep["rows"]
    assert single["layers"] == [[0, 30]] and single["ratio"] == 1.0
    assert two["layers"] == [[0, 15], [15, 30]] and two["max_stage_layers"] == 15
    assert three["layers"] == [[0, 10], [10, 20], [20, 30]] and three["ideal_ratio"] == 0.3333
    for r in rep["rows"]:
        assert len(r["ttft_samples_s"]) == 1 and r["ttft_s"] == r["ttft_samples_s"][0] > 0
        assert r["stage_s_per_layer"] == round(r["ttft_s"] / r["max_stage_layers"], 5)
        assert r["same_first_token"] is True and r["fallbacks"] == []
        assert r["unexpected_layers"] == [] and r["worker_warnings"] == []
    for r in (two, three):  # the lead handed every chunk's hidden states on
        assert r["bytes_sent"] > 0 and r["handoff_s"] > 0 and r["ratio"] > 0
    assert single["bytes_sent"] == 0
    assert rep["ok"] is True
    assert rep["plot"] == str(png) and png.read_bytes()[:8] == PNG
    fig = FIGURES["pipeline"](rep)
    assert [ax.get_title() for ax in fig.axes] == [
        "TTFT", "stage time per layer (TTFT / the largest stage's layers)"]
    assert [len(c) for c in fig.axes[0].containers] == [1, 1, 1]  # a bar per stage count


def test_stage_counts_without_the_single_instance_are_refused() -> None:
    res = CliRunner().invoke(app, ["--json", "bench", "pipeline", "--stages", "2,3"])
    assert res.exit_code == 2
    assert res.output == ("error: --stages: give stage counts in 1..8, 1 among them (the "
                          "single instance every row is compared with), e.g. 1,2,3\n")
