"""`mooncake bench trace --local P,D --engine E --block-size B`: the workers' engine and block
size, the options refused with them, and every policy's figures against kvcache-centric's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.procs import child_env
from tests.helpers.store_procs import REPO


def bench_trace(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mooncake_cli", "bench", "trace", *args],
                          capture_output=True, text=True, cwd=REPO, env=child_env(),
                          timeout=timeout)


@pytest.mark.parametrize(("args", "line"), [
    (["--local", "1,1", "--engine", "vllm", "--policy", "kvcache-centric,kvcache-pipeline"],
     "error: --policy kvcache-pipeline runs pipeline stages on our engine's prefill workers "
     "only; with --engine vllm leave it out"),
    (["--url", "http://127.0.0.1:9", "--engine", "native"],
     "error: --engine chooses the engine of the --local workers; a running conductor's "
     "workers have theirs"),
    (["--local", "1,1", "--engine", "tpu"], "error: engine 'tpu': use one of "),
])
def test_refused_in_one_line_before_any_start(args: list[str], line: str) -> None:
    done = bench_trace(*args)
    assert done.returncode == 2
    [got] = done.stderr.strip().splitlines()
    assert got.startswith(line), got


def test_every_policy_against_kvcache_centric_on_the_block_size_given(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    lines = [{"timestamp": i * 100, "input_length": 4 * 512, "output_length": 2,
              "hash_ids": [1, 2, 3, 10 + i]} for i in range(6)]
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    done = subprocess.run(
        [sys.executable, "-m", "mooncake_cli", "--json", "bench", "trace", "--trace",
         str(trace), "--local", "2,1", "--engine", "native", "--block-size", "32",
         "--block-tokens", "32", "--max-output", "2", "--kv-blocks", "64",
         "--policy", "kvcache-centric,least-load,random"],
        capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=600)
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)
    assert rep["setup"]["engine"] == "native" and rep["setup"]["block_size"] == 32
    assert rep["target"] == "local 2,1 (demo, native)"
    runs = rep["runs"]
    assert list(runs) == ["kvcache-centric", "least-load", "random"]
    assert all(r["served"] == 6 and r["errors"] == 0 for r in runs.values())
    # 128-token prompts sharing their first 3 blocks of 32: a later one reuses some
    assert runs["kvcache-centric"]["prefix_hit_ratio"] > 0
    centric = runs["kvcache-centric"]
    for other in ("least-load", "random"):
        assert rep["ratios"][f"mean TTFT {other}/kvcache-centric"] == pytest.approx(
            runs[other]["ttft_s"]["mean"] / centric["ttft_s"]["mean"])
        assert rep["ratios"][f"hit ratio kvcache-centric - {other}"] == pytest.approx(
            centric["prefix_hit_ratio"] - runs[other]["prefix_hit_ratio"])
