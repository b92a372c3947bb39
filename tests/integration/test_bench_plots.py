"""`mooncake bench ... --plot FILE.png`: every bench kind, run for real at its smallest sizes,
writes a PNG, and the figure built from the printed --json result has the panels and series the
run measured; without matplotlib each command says which extra to install, in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mooncake_cli.app import app
from mooncake_cli.bench import upstream
from mooncake_cli.commands.bench_plot import FIGURES

runner = CliRunner()
PNG = b"\x89PNG\r\n\x1a\n"
EXTRA = "pip install 'mooncake-cli[plot]'"


def bench(tmp_path: Path, kind: str, *args: str) -> tuple[dict[str, Any], Any]:
    """Run `bench KIND ARGS --plot` with --json; the result and the figure rebuilt from it."""
    png = tmp_path / "plots" / f"{kind}.png"
    res = runner.invoke(app, ["--json", "bench", kind, *args, "--plot", str(png)],
                        prog_name="mooncake")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["plot"] == str(png) and png.read_bytes()[:8] == PNG
    return data, FIGURES[kind](data)


def labels(ax: Any) -> list[str]:
    return list(ax.get_legend_handles_labels()[1])


def write_trace(path: Path, rows: list[tuple[int, int, int, list[int]]]) -> str:
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": o,
                                        "hash_ids": h}) + "\n" for t, n, o, h in rows))
    return str(path)


def small_trace(tmp_path: Path) -> str:
    """40 requests over 20 s; pairs share a prefix, so caches have something to find."""
    return write_trace(tmp_path / "trace.jsonl",
                       [(i * 500, 1536, 4, [i // 2, 100 + i // 2, 200 + i]) for i in range(40)])


@pytest.mark.skipif(not upstream.available()[0], reason="upstream wheel does not import: "
                    "pip install 'mooncake-cli[upstream]'")
def test_transfer_draws_each_op_against_block_size_beside_upstream(tmp_path: Path) -> None:
    data, fig = bench(tmp_path, "transfer", "--transport", "tcp", "--duration", "0.2",
                      "--buffer-size", "1MiB", "--sweep", "4KiB,64KiB", "--compare-upstream")
    assert len(data["reports"]) == 4
    assert [ax.get_title() for ax in fig.axes] == [
        "write: throughput", "read: throughput", *(f"{op}: p50 latency per batch (per block "
                                                   "for references)" for op in ("write", "read"))]
    for ax in fig.axes:
        assert labels(ax) == ["ours", "upstream", "socket"]
        assert all(list(line.get_xdata()) == [4096, 65536] for line in ax.get_lines())


def test_store_draws_each_operation_against_value_size(tmp_path: Path) -> None:
    data, fig = bench(tmp_path, "store", "--sizes", "4KiB,64KiB", "--batches", "1,2",
                      "--duration", "0.1", "--iterations", "3", "--segment-size", "4MiB",
                      "--tensor-sizes", "")
    assert {r["row"]["op"] for r in data["reports"]} == {"put", "get", "exists"}
    assert [ax.get_title() for ax in fig.axes] == ["put", "get"]  # exists moves no bytes
    for ax in fig.axes:
        assert labels(ax) == ["ours x1", "ours x2"]
        assert [len(line.get_xdata()) for line in ax.get_lines()] == [2, 2]


def test_chaos_draws_recovery_and_ha_on_vs_off(tmp_path: Path) -> None:
    data, fig = bench(tmp_path, "chaos", "--kills", "1", "--sizes", "4KiB,64KiB", "--duration",
                      "0.3", "--segment-size", "32MiB")
    assert data["kills"] == 1 and len(data["recovery_s"]) == 1
    recovery, puts, latency = fig.axes
    assert labels(recovery) == ["gets work again"]
    assert list(recovery.get_lines()[0].get_xdata()) == data["recovery_s"]
    assert labels(puts) == ["off", "on"]
    assert labels(latency) == ["off p50", "off p99", "on p50", "on p99"]


def test_store_policy_draws_hit_ratio_against_capacity(tmp_path: Path) -> None:
    data, fig = bench(tmp_path, "store-policy", "--trace", small_trace(tmp_path), "--policy",
                      "lru,prefix", "--capacity", "5%,50%")
    (ax,) = fig.axes
    assert labels(ax) == ["lru", "prefix", "belady (bound)", "infinite cache"]
    lru = ax.get_lines()[0]
    assert list(lru.get_ydata()) == [r["policies"]["lru"]["prefix_hit_ratio"]
                                     for r in data["capacities"]]


def test_trace_simulated_draws_ttft_by_policy_distributions_and_hits(tmp_path: Path) -> None:
    data, _ = bench(tmp_path, "trace", "--simulate", "--trace", small_trace(tmp_path),
                    "--policy", "random,kvcache-centric", "--prefill", "2", "--decode", "1",
                    "--colocated", "-1")
    fig = FIGURES["trace"](data)  # from the printed JSON alone: no per-request samples
    by_policy, hits = fig.axes
    assert [len(c) for c in by_policy.containers] == [2, 2, 2]  # p50, p90, p99 x 2 policies
    assert labels(hits) == ["random", "kvcache-centric", "infinite cache (whole trace)"]
    samples = {"ttft": {"random": [0.2, 0.4], "kvcache-centric": [0.1]}, "tbt": {}}
    assert [ax.get_title() for ax in FIGURES["trace"](data, samples).axes] == [
        "TTFT by policy", "TTFT distribution", "prefix-hit ratio over time"]


def test_profile_draws_measured_against_predicted(tmp_path: Path) -> None:
    data, fig = bench(tmp_path, "profile", "--model", "demo", "--lengths", "16,32,64",
                      "--cached", "0,0.5", "--batches", "1,4", "--contexts", "16",
                      "--repeats", "1", "--block-size", "8", "-o", str(tmp_path / "p.json"))
    prefill, decode = fig.axes
    for ax, kind in ((prefill, "prefill"), (decode, "decode")):
        assert labels(ax) == ["fitted", "held-out", "predicted = measured"]
        fitted, held = ax.get_lines()[:2]
        assert len(fitted.get_xdata()) == len(data["profile"][kind])
        assert len(held.get_xdata()) == len(data["profile"]["held_out"][kind])


def test_workers_draws_medians_and_every_measurement(tmp_path: Path) -> None:
    data, fig = bench(tmp_path, "workers", "--model", "demo", "--decode-model", "demo",
                      "--prompt-tokens", "64", "--repeats", "2", "--concurrency", "2",
                      "--max-tokens", "4")
    ttft, decode = fig.axes
    assert [b.get_height() for b in ttft.containers[0]] == [
        data["prefix_reuse"]["median_cold_s"], data["prefix_reuse"]["median_cached_s"]]
    assert [len(line.get_ydata()) for line in ttft.get_lines()] == [2, 2]  # 2 repeats each
    assert [len(line.get_ydata()) for line in decode.get_lines()] == [2, 2]


def test_model_draws_ours_beside_transformers(tmp_path: Path) -> None:
    from tests.helpers.tiny_models import write_model

    ckpt = write_model(tmp_path / "tiny", "llama", seed=2)
    data, fig = bench(tmp_path, "model", "--model", str(ckpt), "--threads", "1", "--tokens",
                      "2", "--concurrency", "2", "--prompt-tokens", "16", "--repeats", "1")
    decode, ttft = fig.axes
    assert labels(decode) == ["bandwidth limit, 1 stream", "ours", "transformers"]
    assert [len(c) for c in decode.containers] == [3, 3]
    assert [c[0].get_height() for c in ttft.containers] == [data["ours"]["ttft_s"],
                                                            data["transformers"]["ttft_s"]]


def test_burst_draws_outcomes_latency_and_throughput(tmp_path: Path) -> None:
    data, fig = bench(tmp_path, "burst", "--local", "1,1", "--model", "demo", "--requests", "3",
                      "--max-tokens", "4", "--kv-blocks", "64", "--warmup", "0", "--clients", "1")
    (run,) = data["runs"]
    outcomes, latency, throughput = fig.axes
    assert labels(outcomes) == ["answered", "429", "503", "errors"]
    assert outcomes.containers[0][0].get_height() == run["answered"]
    assert len(latency.containers) == 6
    assert throughput.containers[0][0].get_height() == run["tokens_per_s"]


COMMANDS = [["transfer"], ["store"], ["chaos"], ["store-policy", "--trace", "T"],
            ["trace", "--simulate", "--trace", "T"], ["profile"], ["workers"], ["model"],
            ["burst"]]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_without_matplotlib_one_line_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path, argv: list[str]) -> None:
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # as if not installed
    argv = [small_trace(tmp_path) if a == "T" else a for a in argv]
    res = runner.invoke(app, ["bench", *argv, "--plot", str(tmp_path / "out" / "x.png")],
                        prog_name="mooncake")
    assert res.exit_code == 2
    assert res.output.strip() == f"error: --plot needs matplotlib: {EXTRA}"
    assert not (tmp_path / "out").exists()


def test_bad_plot_paths_are_one_line(tmp_path: Path) -> None:
    trace = small_trace(tmp_path)
    for path, words in ((str(tmp_path / "charts"), "ending in .png"),
                        (str(tmp_path / "trace.jsonl" / "x.png"), "cannot create")):
        res = runner.invoke(app, ["bench", "store-policy", "--trace", trace, "--plot", path])
        assert res.exit_code == 2 and words in res.output and len(res.output.splitlines()) == 1
    res = runner.invoke(app, ["bench", "transfer", "--mode", "target", "--plot", "x.png"])
    assert res.exit_code == 2 and "measures nothing" in res.output
