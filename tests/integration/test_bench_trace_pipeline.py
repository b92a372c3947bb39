"""`mooncake bench trace --local 3,1` with kvcache-pipeline next to kvcache-centric: a
long-prompt slice of a trace replayed live on smollm2-135m, and the simulator's prediction for
the same requests and cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mooncake_cli.bench.trace_live import ReplayConfig, long_prompts, synthesise
from mooncake_cli.bench.trace_predict import sim_requests
from mooncake_cli.sim.trace import TraceRequest
from tests.helpers.procs import child_env
from tests.helpers.smollm import NAME, gguf_path
from tests.helpers.store_procs import REPO


def test_the_long_prompt_slice_keeps_arrival_times() -> None:
    cfg = ReplayConfig(block_tokens=64, max_input=300)
    reqs = [TraceRequest(0, 0.0, 512, 4, (1,)), TraceRequest(1, 1.5, 4 * 512, 4, (1, 2, 3, 4)),
            TraceRequest(2, 3.0, 3 * 512 + 1, 4, (1, 2, 3, 5))]
    kept = long_prompts(reqs, cfg, 193)
    assert [(r.index, r.arrival) for r in kept] == [(1, 1.5), (2, 3.0)]
    assert [len(synthesise(r, cfg)) for r in kept] == [256, 193]
    assert long_prompts(reqs, cfg, 0) == reqs


def test_simulated_requests_are_the_prompts_whole_blocks() -> None:
    cfg = ReplayConfig(block_tokens=64, max_input=300, max_output=8)
    a, b = sim_requests([TraceRequest(0, 2.0, 4 * 512, 100, (1, 2, 3, 4)),
                         TraceRequest(1, 2.5, 3 * 512 + 1, 3, (1, 2, 7, 8))], cfg, 16)
    assert (a.input_tokens, a.output_tokens, a.arrival) == (256, 8, 2.0)
    assert (b.input_tokens, b.output_tokens, b.arrival) == (193, 3, 2.5)
    assert len(a.hash_ids) == 16 and len(b.hash_ids) == 12  # b's last token: no whole block
    assert a.hash_ids[:8] == b.hash_ids[:8] and a.hash_ids[8] != b.hash_ids[8]


def test_pipeline_against_centric_live_and_predicted(tmp_path: Path) -> None:
    gguf_path()
    trace = tmp_path / "trace.jsonl"
    lines = [{"timestamp": i * 1000, "input_length": (4 if i % 3 else 1) * 512,
              "output_length": 4, "hash_ids": [1, 2, 10 + i, 20 + i]} for i in range(6)]
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    done = subprocess.run(
        [sys.executable, "-m", "mooncake_cli", "--json", "bench", "trace", "--trace",
         str(trace), "--local", "3,1", "--model", NAME, "--policy",
         "kvcache-centric,kvcache-pipeline", "--block-tokens", "64", "--min-input", "200",
         "--max-output", "4", "--kv-blocks", "128", "--threads", "1", "--max-stages", "3",
         "--pipeline-chunk", "64", "--pipeline-min-gain", "0.05"],
        capture_output=True, cwd=REPO, env=child_env(), timeout=600)
    assert done.returncode == 0, done.stderr.decode()
    rep = json.loads(done.stdout)
    assert rep["requests"] == 4  # requests 0 and 3 have 64-token prompts
    assert rep["setup"] | {"min_input": 200, "threads": 1, "max_stages": 3,
                           "pipeline_chunk": 64} == rep["setup"]
    runs = rep["runs"]
    assert set(runs) == {"kvcache-centric", "kvcache-pipeline"}
    for r in runs.values():
        assert r["served"] == 4 and r["errors"] == 0 and r["ttft_s"]["mean"] is not None
    assert runs["kvcache-centric"]["pipelined"] == 0
    assert runs["kvcache-pipeline"]["pipelined"] >= 1
    pred = rep["prediction"]
    assert pred["cost_model"] | {"block_tokens": 16, "handoff_from": "kvcache-pipeline"} == \
        pred["cost_model"]
    assert pred["cost_model"]["per_token_s"] == \
        rep["learned_cost_models"]["kvcache-centric"]["per_token_s"]
    sim = pred["policies"]
    assert set(sim) == {"kvcache-centric", "kvcache-pipeline"}
    assert all(r["served"] == 4 and r["ttft_s"]["mean"] > 0 for r in sim.values())
    assert sim["kvcache-centric"]["pipelined"] == 0 and sim["kvcache-pipeline"]["pipelined"] >= 1
    gain = pred["gain"]
    assert isinstance(gain["predicted"], float) and isinstance(gain["live"], float)
    assert gain["difference_points"] == round((gain["live"] - gain["predicted"]) * 100, 2)


def test_a_slice_that_keeps_nothing_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 512, "output_length": 4,
                                 "hash_ids": [1]}) + "\n")
    bad = subprocess.run([sys.executable, "-m", "mooncake_cli", "bench", "trace", "--trace",
                          str(trace), "--local", "3,1", "--min-input", "100"],
                         capture_output=True, cwd=REPO, env=child_env(), timeout=120)
    assert bad.returncode == 2 and b"--min-input" in bad.stderr
