"""Exactness across processes: prefill -> store -> decode (separate `mooncake prefill` and
`mooncake decode` processes and a real store master) gives transformers' greedy tokens, also when
90% of a prompt's blocks come from the store; both roles register, and stop cleanly on SIGTERM."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mooncake_cli.engine.tokenizer import HFTokenizer
from mooncake_cli.http.jsonhttp import call
from tests.helpers.prom import value
from tests.helpers.store_procs import Proc, start_master
from tests.helpers.tiny_models import PROMPTS, write_model
from tests.helpers.worker_procs import ConductorRecorder, WorkerProc, complete
from tests.integration.test_engine_exact import NEW_TOKENS, hf_greedy

pytestmark = pytest.mark.timeout(240)
BLOCK = 4
GREEDY = {"max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}


@dataclass
class Cluster:
    checkpoint: Path
    prefill: WorkerProc
    decode: WorkerProc
    conductor: ConductorRecorder
    tokenizer: HFTokenizer


@pytest.fixture(scope="module")
def master() -> Iterator[str]:
    proc: Proc = start_master(0)
    yield str(proc.ready["address"])
    proc.stop()


@pytest.fixture(scope="module")
def clusters(master: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Cluster]]:
    """A prefill and a decode process per tiny model, all started together (startup is slow
    on two shared cores)."""
    out = {}
    for kind, tie in (("llama", False), ("qwen2", True)):
        ckpt = write_model(tmp_path_factory.mktemp(kind), kind, tie=tie)
        conductor = ConductorRecorder()
        common = ["--model", str(ckpt), "--block-size", str(BLOCK), "--conductor", conductor.url,
                  "--heartbeat", "0.2"]
        out[kind] = Cluster(
            ckpt,
            WorkerProc("prefill", *common, "--store", master, "--segment-size", "4MiB",
                       "--chunk-size", "5", "--name", f"prefill-{kind}"),
            WorkerProc("decode", *common, "--kv-blocks", "128", "--name", f"decode-{kind}"),
            conductor, HFTokenizer(ckpt / "tokenizer.json"))
    try:
        for c in out.values():
            c.prefill.ready()
            c.decode.ready()
        yield out
    finally:
        for c in out.values():
            c.prefill.stop()
            c.decode.stop()
            c.conductor.close()


@pytest.fixture(params=["llama", "qwen2"])
def cluster(request: pytest.FixtureRequest, clusters: dict[str, Cluster]) -> Cluster:
    return clusters[request.param]


def test_prefill_store_decode_matches_transformers(cluster: Cluster) -> None:
    prompts = [cluster.tokenizer.encode(p) for p in PROMPTS]
    want = hf_greedy(cluster.checkpoint, prompts)
    for i, ids in enumerate(prompts):
        answer, got, final = complete(cluster.prefill.url, cluster.decode.url, f"exact-{i}", ids,
                                      GREEDY)
        assert got == want[i], f"prompt {i}"
        assert final == {"finish_reason": "length", "completion_tokens": NEW_TOKENS}
        assert answer["prompt_tokens"] == len(ids)
        assert len(answer["stored_keys"]) == len(ids) // BLOCK
    load = call(cluster.decode.url + "/v1/load").body
    assert load["free_blocks"] == load["total_blocks"] == 128, "finished requests free blocks"


def test_ninety_percent_of_blocks_from_the_store(cluster: Cluster) -> None:
    ids = cluster.tokenizer.encode(" ".join(reversed(PROMPTS)))
    full = len(ids) // BLOCK
    assert full >= 10
    cached = -(-9 * full // 10)  # 90% of the blocks, rounded up
    [want] = hf_greedy(cluster.checkpoint, [ids])
    first, _, _ = complete(cluster.prefill.url, None, "prime", ids[:cached * BLOCK], GREEDY)
    assert first["cached_tokens"] == 0 and len(first["stored_keys"]) == cached
    answer, got, _ = complete(cluster.prefill.url, cluster.decode.url, "ninety", ids, GREEDY)
    assert answer["cached_tokens"] == cached * BLOCK
    # the blocks after the cached ones, each stored once: 4 MiB holds every block of these
    # tests (about a KiB each) and nothing else writes these keys
    assert len(answer["stored_keys"]) == full - cached
    assert not set(answer["stored_keys"]) & set(first["stored_keys"])
    assert got == want
    metrics = call(cluster.prefill.url + "/metrics").body["text"]
    assert value(metrics, "mooncake_worker_prefix_hit_tokens_total", role="prefill") == \
        cached * BLOCK


def test_registration_and_clean_shutdown(cluster: Cluster) -> None:
    for worker in (cluster.prefill, cluster.decode):
        health = call(worker.url + "/health").body
        assert health == {"status": "ok", "role": worker.role, "name": worker.info["name"],
                          "model": worker.info["model"], "block_size": BLOCK}
    with cluster.conductor.lock:
        seen = {r["name"]: r for r in cluster.conductor.registered}
    assert set(seen) == {cluster.prefill.info["name"], cluster.decode.info["name"]}
    for worker in (cluster.prefill, cluster.decode):
        reg = seen[worker.info["name"]]
        assert reg["role"] == worker.role and reg["url"] == worker.url
        assert reg["block_size"] == BLOCK and reg["model"] == worker.info["model"]
        assert set(reg["load"]) >= {"running", "waiting", "free_blocks", "total_blocks",
                                    "recent_step_s", "queued_prefill_tokens"}
        rc, lines = worker.stop()
        assert rc == 0
        assert [e["event"] for e in lines] == ["stopping", "stopped"]
    with cluster.conductor.lock:
        gone = {d["name"] for d in cluster.conductor.deregistered}
    assert gone == {cluster.prefill.info["name"], cluster.decode.info["name"]}
