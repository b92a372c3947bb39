"""`mooncake bench trace --local P,D`: a trace replayed through a live cluster, and the token
synthesis that makes equal hash ids equal token blocks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mooncake_cli.bench.trace_live import Outcome, ReplayConfig, synthesise
from mooncake_cli.sim.trace import TraceRequest
from tests.helpers.procs import child_env
from tests.helpers.store_procs import REPO


def test_equal_hash_ids_give_equal_token_blocks() -> None:
    cfg = ReplayConfig(block_tokens=4, max_input=64, vocab=50)
    a = synthesise(TraceRequest(0, 0.0, 3 * 512, 8, (7, 8, 9)), cfg)
    b = synthesise(TraceRequest(1, 0.0, 2 * 512 + 100, 8, (7, 8, 11)), cfg)
    assert len(a) == 12 and len(b) == 9  # 512-token blocks scaled to 4 tokens each
    assert a[:8] == b[:8] and a[8:] != b[8:]
    assert all(1 <= t < 50 for t in a)
    assert synthesise(TraceRequest(0, 0.0, 3 * 512, 8, (7, 8, 9)),
                      ReplayConfig(block_tokens=4, vocab=50, seed=1))[:4] != a[:4]


def test_tbt_is_the_mean_of_the_longest_tenth_of_gaps() -> None:
    o = Outcome(200, 0.1, [0.01] * 18 + [0.5, 0.3])
    assert o.tbt() == (0.5 + 0.3) / 2
    assert Outcome(200, 0.1, []).tbt() is None


def test_replay_through_a_local_cluster(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    lines = [{"timestamp": i * 100, "input_length": 3 * 512, "output_length": 4,
              "hash_ids": [1, 2, 3 + i % 2]} for i in range(6)]
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    done = subprocess.run(
        [sys.executable, "-m", "mooncake_cli", "--json", "bench", "trace", "--trace",
         str(trace), "--local", "1,1", "--policy", "kvcache-centric", "--block-tokens", "16",
         "--max-output", "4", "--kv-blocks", "128", "--plot", str(tmp_path / "live.png")],
        capture_output=True, cwd=REPO, env=child_env(), timeout=240)
    assert done.returncode == 0, done.stderr.decode()
    run = json.loads(done.stdout)["runs"]["kvcache-centric"]
    assert run["served"] == 6 and run["errors"] == 0
    assert run["ttft_s"]["mean"] is not None and run["tbt_s"]["p99"] is not None
    # prompts of 48 tokens share their first 2 (later 3) blocks: repeats reuse them
    assert run["prefix_hit_ratio"] > 0.3
    over_time = run["hit_over_time"]  # from each answer's usage.prompt_tokens_details
    assert over_time and over_time[0]["hit_ratio"] == 0.0 and over_time[-1]["hit_ratio"] > 0.3
    plot = json.loads(done.stdout)["plot"]
    assert plot == str(tmp_path / "live.png") and Path(plot).read_bytes().startswith(b"\x89PNG")
    bad = subprocess.run([sys.executable, "-m", "mooncake_cli", "bench", "trace", "--trace",
                          str(trace)], capture_output=True, cwd=REPO, env=child_env(), timeout=120)
    assert bad.returncode == 2 and b"--simulate" in bad.stderr
