"""The benchmarks on vLLM workers, tiny: `bench trace --local 1,1 --engine vllm` (the prefix
hits the conductor counts are the cached tokens vLLM reported), `bench prefix-reuse` (a prefix
prefill-a computed is loaded by prefill-b from the store; a fresh one is not) and `bench
conductor-cpu --engine vllm`. One vLLM cluster at a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_engine_vllm import env

RUN_S = 1800  # a whole cluster of vLLM engines started on 2 busy cores, then measured
# vLLM starts only with room for one request of smollm2's 8,192 positions (and a block more)


def bench(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "mooncake_cli", "--json", "bench", *args],
                          capture_output=True, text=True, env=env(), timeout=RUN_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


def test_trace_on_vllm_counts_the_tokens_vllm_found_cached(model_dir: Path,
                                                          tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    # 3 s apart: each prompt's blocks are in vLLM's cache before the next arrives
    lines = [{"timestamp": i * 3000, "input_length": 3 * 512, "output_length": 2,
              "hash_ids": [1, 2, 10 + i]} for i in range(4)]
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rep = bench("trace", "--trace", str(trace), "--local", "1,1", "--engine", "vllm",
                "--model", "smollm2-135m", "--block-size", "32", "--block-tokens", "32",
                "--max-output", "2", "--kv-blocks", "320", "--policy", "kvcache-centric",
                "--vocab", "20000")
    run = rep["runs"]["kvcache-centric"]
    assert rep["setup"]["engine"] == "vllm" and run["served"] == 4 and run["errors"] == 0
    # 96-token prompts, one prefill worker: each later one finds the first 2 blocks cached
    assert run["prefix_hit_ratio"] == round(3 * 64 / (4 * 96), 4)
    bins = run["hit_over_time"]  # the answers' usage: vLLM's num_cached_tokens
    assert bins[0]["hit_ratio"] == 0.0 and bins[-1]["hit_ratio"] == round(64 / 96, 4)


def test_prefix_reuse_loads_the_other_workers_prefix_from_the_store(model_dir: Path) -> None:
    rep = bench("prefix-reuse", "--prefix", "256", "--suffix", "32", "--repeats", "2",
                "--kv-blocks", "80")
    for row in rep["rows"]:
        assert row["store_cached_tokens"] == 256  # both whole blocks of 128, from the store
        assert row["recompute_cached_tokens"] == 0
        assert row["ratio"] == round(row["store_ttft_s"] / row["recompute_ttft_s"], 4)
    assert rep["setup"]["engine"] == "vllm" and rep["ratio_of_means"] > 0


def test_conductor_cpu_in_front_of_vllm(model_dir: Path) -> None:
    rep = bench("conductor-cpu", "--engine", "vllm", "--block-size", "128", "--kv-blocks",
                "80", "--requests", "6", "--prompt-tokens", "64", "--idle", "1")
    run = rep["runs"]["vllm"]
    assert run["served"] == 6 and run["errors"] == 0 and run["conductor_cpu_s"] > 0
