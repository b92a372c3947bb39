"""`mooncake bench profile --url` against a real vLLM server (smollm2-135m): a profile.json the
conductor's cost model loads, whose cached samples were real prefix-cache hits (checked by the
answers' usage with --enable-prompt-tokens-details, by vLLM's metrics without it), and the
grids the server cannot run refused up front."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mooncake_cli.scheduler.costmodel import load_profile
from procs import poll
from sides import base_env
from vllm_server import VllmServer

HITS = "vllm:prefix_cache_hits_total"
GRID = ["--lengths", "128,256,512", "--cached", "0,0.5", "--batches", "1,2", "--contexts", "64",
        "--repeats", "1"]


@pytest.fixture(scope="module", params=["usage", "metrics"])
def served(request: pytest.FixtureRequest, model_dir: Path,
           logs: Path) -> Iterator[tuple[VllmServer, str]]:
    """(a vLLM server, how bench profile can check its cache hits): one at a time."""
    args = ["--enable-prompt-tokens-details"] if request.param == "usage" else []
    s = VllmServer(f"profile-{request.param}", model_dir, base_env(),
                   logs / f"vllm-profile-{request.param}.log", args=args)
    try:
        yield s.wait_ready(), request.param
    finally:
        s.stop()


def profile(url: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mooncake_cli", "--json", "bench", "profile",
                           "--url", url, *args, "-o", str(out)], env=base_env(),
                          capture_output=True, text=True, timeout=900)


def test_profile_of_a_vllm_server_fits_the_conductors_model(served: tuple[VllmServer, str],
                                                            model_dir: Path,
                                                            tmp_path: Path) -> None:
    server, checked_by = served
    out = tmp_path / "profile.json"
    before = server.metric(HITS)
    p = profile(server.url, out, *GRID)
    assert p.returncode == 0, p.stderr[-3000:]
    report, doc = json.loads(p.stdout), json.loads(out.read_text())
    model = load_profile(str(out))  # the conductor's loader: valid, and the same fit
    assert doc["fit"] == {k: getattr(model, k) for k in doc["fit"]}
    assert report["fit_error"]["all"]["max"] == max(r["error"] for r in report["held_out"])
    assert doc["model"] == str(model_dir) and doc["device"].startswith("vLLM 0.")
    cfg = json.loads((model_dir / "config.json").read_text())
    head = cfg["hidden_size"] // cfg["num_attention_heads"]
    # K and V of every layer, in the server's float32 (vllm_server.ARGS)
    assert doc["kv_bytes_per_token"] == 2 * cfg["num_hidden_layers"] * \
        cfg["num_key_value_heads"] * head * 4
    bs = doc["block_tokens"]
    assert f'block_size="{bs}"' in server.http.get("/metrics").text
    samples = doc["prefill"] + doc["held_out"]["prefill"]
    cached = [s["cached_tokens"] for s in samples if s["cached_tokens"]]
    assert cached and all(c % bs == 0 for c in cached)
    rounds = 2  # --repeats 1 and the warm-up round
    verified = {"usage": 0, "metrics": 0, "none": 0, checked_by: rounds * len(cached)}
    assert doc["server"]["cached_samples_verified_by"] == verified
    # vLLM's own counter: every timed request reused exactly its primed prefix, nothing more
    want = rounds * sum(cached)
    poll(lambda: True if server.metric(HITS) - before >= want else None, 10)
    assert server.metric(HITS) - before == want
    for s in doc["decode"] + doc["held_out"]["decode"]:
        assert s["batch"] * 64 < s["context_tokens"] < s["batch"] * (64 + 40)
    assert all(s["seconds"] > 0 for s in samples + doc["decode"])


@pytest.mark.parametrize("args,words", [
    (["--lengths", "64,128,256", "--block-size", "7"], "-token KV blocks, not 7 (--block-size)"),
    (["--lengths", "64,128,4096"], "takes at most 2048 tokens per sequence; this grid needs 4097"),
    (["--lengths", "64,128,256", "--batches", "64", "--contexts", "1024"],
     "KV tokens; the largest decode batch needs"),
])
def test_grids_the_server_cannot_run_are_refused(served: tuple[VllmServer, str],
                                                 args: list[str], words: str,
                                                 tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    p = profile(served[0].url, out, *args)
    assert p.returncode == 2, p.stderr[-3000:]
    assert words in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not out.exists()
