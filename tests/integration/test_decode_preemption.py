"""Decode KV allocated as sequences grow: requests that together outgrow the cache are preempted
(the most recently admitted first), parked in a real store master and resumed, and each one's
greedy tokens equal its run alone — on the real smollm2-135m, and on the demo model without a
store (resumption recomputes everything) with seeded sampling."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_cli.config.store import StoreConfig
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.store.service import MasterService, master_from
from mooncake_cli.worker.decode import DecodeWorker
from mooncake_cli.worker.prefill import PrefillWorker
from tests.helpers.smollm import NAME, gguf_path
from tests.helpers.worker_procs import complete

pytestmark = pytest.mark.timeout(300)
BLOCK = 16


@pytest.fixture(scope="module")
def master() -> Iterator[str]:
    with MasterService(master_from(StoreConfig()), "127.0.0.1", 0) as m:
        yield m.address


def run_together(prefill: PrefillWorker, decode: DecodeWorker, prompts: list[list[int]],
                 sampling: list[dict[str, Any]], tag: str) -> list[list[int]]:
    """Prefill every prompt, then decode all of them at once."""
    out: list[list[int]] = [[] for _ in prompts]
    barrier = threading.Barrier(len(prompts))

    def run(i: int) -> None:
        out[i] = complete(prefill.url, decode.url, f"{tag}-{i}", prompts[i], sampling[i],
                          between=lambda: barrier.wait(120))[1]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    return out


def test_preempted_smollm_sequences_resume_from_the_store_exactly(master: str) -> None:
    gguf_path()
    common = {"model": NAME, "block_size": BLOCK, "store": master, "threads": 2}
    prefill = PrefillWorker(WorkerConfig(role="prefill", **common))
    tok = prefill.model.tokenizer
    texts = ["The history of the Roman Empire begins", "A cache keeps recently used data",
             "def merge_sort(items):", "Photosynthesis turns light into"]
    prompts = [list(tok.encode(t)) for t in texts]
    sampling = [{"max_tokens": 56, "temperature": 0, "ignore_eos": True}] * len(prompts)
    # each request alone needs <= 5 blocks; together they outgrow 12
    decode = DecodeWorker(WorkerConfig(role="decode", kv_blocks=12, **common))
    with prefill, decode:
        alone = [complete(prefill.url, decode.url, f"alone-{i}", p, s)[1]
                 for i, (p, s) in enumerate(zip(prompts, sampling, strict=True))]
        assert decode.metrics.get("preemptions") == 0
        together = run_together(prefill, decode, prompts, sampling, "together")
        load = decode.load()
        assert load["preemptions"] >= 1, "the cache was big enough: nothing was preempted"
        assert load["reloaded_blocks"] >= 1, "resumed sequences read nothing from the store"
        assert load["parked_blocks"] >= load["reloaded_blocks"]
        assert together == alone
        assert load["free_blocks"] == 12 and load["preempted"] == 0


def test_without_a_store_resumption_recomputes_and_seeded_sampling_holds() -> None:
    prefill = PrefillWorker(WorkerConfig(role="prefill", block_size=8))
    decode = DecodeWorker(WorkerConfig(role="decode", block_size=8, kv_blocks=20))
    text = b"Preemption frees blocks for the oldest requests. "
    prompts = [[256, *text[:n]] for n in (10, 20, 30, 15)]
    sampling: list[dict[str, Any]] = [
        {"max_tokens": 40, "ignore_eos": True},
        {"max_tokens": 40, "ignore_eos": True, "temperature": 0.9, "seed": 11},
        {"max_tokens": 40, "ignore_eos": True},
        {"max_tokens": 40, "ignore_eos": True, "temperature": 0.7, "top_p": 0.8, "seed": 3}]
    with prefill, decode:
        alone = [complete(prefill.url, decode.url, f"a-{i}", p, s)[1]
                 for i, (p, s) in enumerate(zip(prompts, sampling, strict=True))]
        together = run_together(prefill, decode, prompts, sampling, "t")
        load = decode.load()
        assert load["preemptions"] >= 1
        assert load["reloaded_blocks"] == 0 and load["recomputed_tokens"] > 0
        assert together == alone
        assert load["free_blocks"] == 20
