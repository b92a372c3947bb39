"""The trace simulator: determinism with a seed, the metrics on hand-built traces, colocated
baselines stalling decodes, and `mooncake bench trace --simulate` on a slice of the real trace.

Checks are on behaviour and structure, never on timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mooncake_cli.app import app
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.costmodel import paper
from mooncake_cli.sim.cluster import colocated, disaggregated
from mooncake_cli.sim.events import SimRecord
from mooncake_cli.sim.metrics import capacity, percentile
from mooncake_cli.sim.settings import SimConfig
from mooncake_cli.sim.trace import TraceRequest, load_trace, prefix_ceiling

TRACE = "conversation"  # the FAST'25 trace shipped with the package (mooncake_cli/data)
runner = CliRunner()


def write_trace(path: Path, rows: list[tuple[int, int, int, list[int]]]) -> str:
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": o,
                                        "hash_ids": h}) + "\n" for t, n, o, h in rows))
    return str(path)


def test_trace_loading_and_ceiling(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.jsonl", [(2000, 1024, 5, [1, 2]), (0, 1500, 3, [1, 2, 3]),
                                              (4000, 700, 1, [1, 9])])
    reqs = load_trace(path, time_scale=2.0)
    assert [r.arrival for r in reqs] == [0.0, 1.0, 2.0] and reqs[0].hash_ids == (1, 2, 3)
    # second request reuses blocks 1,2 (1024 of 1024 tokens), third block 1 (512 of 700)
    assert prefix_ceiling(reqs) == pytest.approx((1024 + 512) / (1500 + 1024 + 700))
    assert len(load_trace(path, limit=2)) == 2


@pytest.mark.parametrize("line,match", [
    ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}', "cover"),
    ('{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [1]}', "timestamp"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "x"}', "hash_ids"),
    ('not json', "not JSON"),
])
def test_bad_trace_lines(tmp_path: Path, line: str, match: str) -> None:
    (tmp_path / "bad.jsonl").write_text(line + "\n")
    with pytest.raises(ConfigError, match=match):
        load_trace(str(tmp_path / "bad.jsonl"))


def test_tbt_is_mean_of_longest_tenth_of_gaps() -> None:
    rec = SimRecord(TraceRequest(0, 0.0, 10, 21, (1,)), 0.0, first_token=1.0, last=1.0,
                    remaining=20)
    rec.tokens(1.0, 0.1, 18)  # 18 gaps of 0.1 s
    rec.tokens(rec.last + 0.5, 0.1, 2)  # a 0.6 s stall, then one 0.1 s gap
    assert rec.remaining == 0
    assert rec.tbt() == pytest.approx((0.6 + 0.1) / 2)  # 20 gaps: the longest 2
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0 and percentile([], 0.5) is None
    late = SimRecord(TraceRequest(1, 0.0, 10, 21, (1,)), 0.0, first_token=40.0)
    late.remaining = 0
    assert capacity([rec, late], 30.0, [0.2, 0.4]) == {"200ms": 0, "400ms": 1}


def test_colocated_prefill_stalls_running_decodes(tmp_path: Path) -> None:
    long_ids = list(range(100, 160))  # 30k tokens: a prefill of several seconds
    path = write_trace(tmp_path / "t.jsonl", [(0, 1000, 400, [1, 2]),
                                              (2000, 30000, 2, long_ids)])
    reqs = load_trace(path)
    cfg = SimConfig(prefill=1, decode=1, colocated=1)
    model = paper()
    stall = model.prefill_time(30000)
    whole = {r.req.index: r for r in colocated(reqs, model, cfg, False, 0)}
    chunked = {r.req.index: r for r in colocated(reqs, model, cfg, False, 512)}
    assert whole[0].tbt() is not None and whole[0].tbt() > stall / 40  # one gap of `stall`
    assert whole[0].longest >= stall
    assert chunked[0].longest < stall / 10
    split = {r.req.index: r for r in disaggregated(reqs, "least-load", model, cfg)[0]}
    assert split[0].longest < stall / 10  # its decode instance never stalls


def test_simulation_is_deterministic_with_a_seed() -> None:
    reqs = load_trace(str(TRACE), 2.0, 400)
    cfg = SimConfig(prefill=4, decode=2)

    def run(seed: int, policy: str) -> list[tuple[float | None, str, int]]:
        recs, _ = disaggregated(reqs, policy, paper(), SimConfig(prefill=4, decode=2, seed=seed))
        return [(r.ttft, r.instance, r.hit_tokens) for r in recs]

    assert run(7, "random") == run(7, "random") != run(8, "random")
    assert run(7, "kvcache-centric") == run(8, "kvcache-centric")
    recs, latency = disaggregated(reqs, "kvcache-centric", paper(), cfg)
    assert len(latency) == len(recs) == 400 and all(r.first_token for r in recs)
    assert all(r.finished is not None for r in recs)


def test_cli_slice_json_explain_and_plot(tmp_path: Path) -> None:
    explain, plot = tmp_path / "explain.jsonl", tmp_path / "plots" / "trace.png"
    res = runner.invoke(app, ["--json", "bench", "trace", "--simulate", "--trace", str(TRACE),
                              "--limit", "300", "--prefill", "4", "--decode", "2",
                              "--colocated", "6", "--policy", "least-load,kvcache-centric",
                              "--explain", str(explain), "--plot", str(plot)])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["requests"] == 300 and set(rep["policies"]) == {"least-load", "kvcache-centric"}
    assert set(rep["baselines"]) == {"vllm", "vllm+prefix", "vllm+chunked",
                                     "vllm+prefix+chunked"}
    for row in [*rep["policies"].values(), *rep["baselines"].values()]:
        assert row["served"] + row["rejected_429"] == 300
        assert row["ttft_s"]["p50"] <= row["ttft_s"]["p99"]
        assert 0 <= row["prefix_hit_ratio"] <= rep["ceiling_hit_ratio"]
        assert row["tbt_s"]["p99"] > 0 and set(row["capacity"]) == {"100ms", "200ms", "300ms"}
    assert rep["policies"]["kvcache-centric"]["schedule_us"]["p50"] > 0
    assert "least-load/kvcache-centric" in rep["ratios"]
    lines = [json.loads(x) for x in explain.read_text().splitlines()]
    assert len(lines) == 600 and all(len(x["candidates"]) == 4 for x in lines)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and rep["plot"] == str(plot)


def test_cli_ttft_slo_answers_429() -> None:
    res = runner.invoke(app, ["--json", "bench", "trace", "--simulate", "--trace", str(TRACE),
                              "--limit", "200", "--prefill", "1", "--decode", "0",
                              "--colocated", "-1", "--policy", "random", "--ttft-slo", "2"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)["policies"]["random"]
    assert 0 < row["rejected_429"] < 200 and row["ttft_s"]["p99"] <= 2.0 + 1e-6
    assert row["tbt_s"] is None and row["capacity"] is None


def test_plot_without_matplotlib_fails_up_front(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # as if not installed
    path = write_trace(tmp_path / "t.jsonl", [(0, 100, 2, [1])])
    res = runner.invoke(app, ["bench", "trace", "--simulate", "--trace", path,
                              "--plot", str(tmp_path / "plots" / "t.png")])
    assert res.exit_code == 2 and "pip install 'mooncake-cli[plot]'" in res.output
    assert not (tmp_path / "plots").exists()


@pytest.mark.parametrize("args,match", [
    (["--trace", "x.jsonl"], "give --simulate, --url"),
    (["--simulate", "--trace", "/nonexistent.jsonl"], "does not exist"),
    (["--simulate", "--trace", "x", "--policy", "best"], "unknown policy"),
    (["--simulate", "--trace", "x", "--prefill", "0"], "--prefill"),
    (["--simulate", "--trace", "x", "--profile", "p.json", "--preset", "paper"], "--preset none"),
])
def test_cli_bad_input(args: list[str], match: str) -> None:
    res = runner.invoke(app, ["bench", "trace", *args])
    assert res.exit_code == 2, res.output
    assert match in res.output


def test_cli_with_a_profile_cost_model(tmp_path: Path) -> None:
    doc = {"schema": "mooncake.profile/1", "model": "tiny", "device": "cpu", "block_tokens": 16,
           "kv_bytes_per_token": 4096, "bandwidth_bytes_per_s": 1e9,
           "prefill": [{"input_tokens": n, "cached_tokens": 0, "seconds": 1e-5 * n}
                       for n in (256, 1024, 4096)],
           "decode": [{"batch": 1, "context_tokens": 100, "seconds": 0.01}]}
    (tmp_path / "profile.json").write_text(json.dumps(doc))
    res = runner.invoke(app, ["--json", "bench", "trace", "--simulate", "--trace", str(TRACE),
                              "--limit", "100", "--profile", str(tmp_path / "profile.json"),
                              "--policy", "cache-aware", "--colocated", "-1"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["model"] == "profile: tiny on cpu" and rep["setup"]["preset"] == "none"
    assert rep["setup"]["kv_bytes_per_token"] == 4096 and rep["baselines"] == {}


def test_bad_trace_leaves_explain_file_alone(tmp_path: Path) -> None:
    keep = tmp_path / "explain.jsonl"
    keep.write_text("earlier run\n")
    (tmp_path / "bad.jsonl").write_text('{"timestamp": 0}\n')
    res = runner.invoke(app, ["bench", "trace", "--simulate", "--trace",
                              str(tmp_path / "bad.jsonl"), "--explain", str(keep)])
    assert res.exit_code == 2 and "bad.jsonl:1" in res.output
    assert keep.read_text() == "earlier run\n"
