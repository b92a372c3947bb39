"""A real vLLM with `--kv-events-config` feeds the conductor's KV indexer: registered through
/register, its blocks of a served prompt are what /query and /query_by_hash answer (also for a
registration at twice vLLM's block size), and after a second prompt evicts part of the first
(a KV cache of 100 blocks), the index answers for the first prompt exactly the prefix vLLM then
reports as cached when the prompt comes again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mooncake_cli.conductor.seqhash import seq_hashes
from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.http import jsonhttp
from mooncake_cli.http.auth import Signer
from procs import poll
from prompts import long_prompt
from sides import base_env
from vllm_server import VllmServer

from tests.conftest import free_port

SECRET = "kv-events-test"
BS = 32  # vLLM's CPU attention takes multiples of 32
SETTLE_S = 60.0  # events follow the answer by a moment (vLLM's publisher thread)


@pytest.fixture(scope="module")
def conductor() -> Iterator[ConductorService]:
    svc = ConductorService(ConductorConfig(port=0, model="demo"), secret=SECRET).start()
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def vllm(model_dir: Path, logs: Path) -> Iterator[tuple[VllmServer, str, str]]:
    pub, replay = free_port(), free_port()
    events = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"}
    server = VllmServer("kv-events", model_dir, base_env(), logs / "vllm-kv-events.log",
                        args=["--block-size", str(BS), "--num-gpu-blocks-override", "100",
                              "--enable-prompt-tokens-details",
                              "--kv-events-config", json.dumps(events)])
    try:
        yield server.wait_ready(), f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}"
    finally:
        server.stop()


def tokens(server: VllmServer, prompt: str) -> list[int]:
    r = server.http.post("/tokenize", json={"model": server.model, "prompt": prompt})
    r.raise_for_status()
    return list(r.json()["tokens"])


def query(svc: ConductorService, ids: list[int], bs: int = BS, **more: Any) -> dict[str, Any]:
    ans = jsonhttp.call(svc.url + "/query", {"model": "m", "block_size": bs, "token_ids": ids,
                                              **more})
    assert ans.status == 200, ans.body
    return dict(ans.body["default"])


def settled(svc: ConductorService, ids: list[int], instance: str, want: int,
            bs: int = BS) -> dict[str, Any]:
    def answer() -> dict[str, Any] | None:
        got = query(svc, ids, bs, instance_id=instance).get(instance, {})
        return got if got.get("longest_matched") == want else None

    got = poll(answer, SETTLE_S, 0.1) or query(svc, ids, bs, instance_id=instance).get(
        instance, {})
    assert got.get("longest_matched") == want, got
    return got


def test_vllm_blocks_are_indexed_and_evictions_removed(conductor, vllm) -> None:
    server, pub, replay = vllm
    for name, bs in (("v", BS), ("v2", 2 * BS)):
        reg = {"endpoint": pub, "replay_endpoint": replay, "type": "vLLM", "modelname": "m",
               "instance_id": name, "block_size": bs, "dp_rank": 0}
        assert jsonhttp.call(conductor.url + "/register", reg, auth=Signer(SECRET)).status == 200
    first, second = long_prompt(1, facts=85), long_prompt(2, facts=85)
    a, b = tokens(server, first), tokens(server, second)
    assert len(a) < 2047 and len(b) < 2047 and a[:BS] != b[:BS]
    server.complete(first, max_tokens=1)
    whole = len(a) // BS * BS
    assert settled(conductor, a, "v", whole) == {
        "longest_matched": whole, "GPU": whole, "CPU": 0, "DISK": 0, "DP": {"0": whole}}
    settled(conductor, a, "v2", len(a) // (2 * BS) * 2 * BS, bs=2 * BS)
    by_hash = jsonhttp.call(conductor.url + "/query_by_hash",
                            {"model": "m", "block_size": BS, "seq_hashes": seq_hashes(a, BS),
                             "instance_id": "v"})
    assert by_hash.body["default"]["v"]["longest_matched"] == whole

    server.complete(second, max_tokens=1)  # 100 blocks hold one of the two prompts, not both
    settled(conductor, b, "v", len(b) // BS * BS)
    left = query(conductor, a, instance_id="v")["v"]["longest_matched"]
    assert 0 < left < whole
    again = server.complete(first, max_tokens=1)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == left
    streams = jsonhttp.call(conductor.url + "/indexer/streams", auth=Signer(SECRET)).body
    counts = {s["instance_id"]: s["counts"] for s in streams["streams"]}
    assert counts["v"]["removed"] > 0
    for skipped in ("malformed_messages", "malformed_events", "orphaned", "tainted",
                    "unrecovered", "other_groups", "dropped"):
        assert counts["v"].get(skipped, 0) == 0, (skipped, counts["v"])
