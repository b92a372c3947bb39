"""The real model across processes: `mooncake prefill` and `mooncake decode` serving
smollm2-135m through a real store master give transformers' greedy tokens on the same 11
prompts as test_smollm_exact.py, also with 90% of a 1.1k-token prompt's blocks in the store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.smollm import NAME, NEW, NINETY, cases
from tests.helpers.store_procs import Proc, start_master
from tests.helpers.worker_procs import ConductorRecorder, WorkerProc, complete

pytestmark = pytest.mark.timeout(600)
BLOCK = 16
SAMPLING = {"max_tokens": NEW, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[WorkerProc, WorkerProc]]:
    master: Proc = start_master(0)
    conductor = ConductorRecorder()
    common = ["--model", NAME, "--block-size", str(BLOCK), "--conductor", conductor.url,
              "--heartbeat", "0.5"]
    prefill = WorkerProc("prefill", *common, "--store", str(master.ready["address"]),
                         "--segment-size", "512MiB", "--chunk-size", "256", "--name", "p-smol")
    decode = WorkerProc("decode", *common, "--kv-blocks", "512", "--name", "d-smol")
    try:
        yield prefill.ready(180), decode.ready(180)
    finally:
        prefill.stop()
        decode.stop()
        conductor.close()
        master.stop()


def test_prefill_and_decode_processes_match_transformers(
        workers: tuple[WorkerProc, WorkerProc]) -> None:
    prefill, decode = workers
    for c in cases():
        if c.name == NINETY:
            continue
        _, got, final = complete(prefill.url, decode.url, f"smol-{c.name}", list(c.ids),
                                 SAMPLING)
        assert tuple(got) == c.want, c.name
        assert final["finish_reason"] == "length"


def test_ninety_percent_from_the_store_matches_transformers(
        workers: tuple[WorkerProc, WorkerProc]) -> None:
    prefill, decode = workers
    [c] = [c for c in cases() if c.name == NINETY]
    ids = list(c.ids)
    full = len(ids) // BLOCK
    cached = -(-9 * full // 10)  # 90% of the prompt's blocks, rounded up
    complete(prefill.url, None, "smol-prime", ids[:cached * BLOCK], SAMPLING)
    answer, got, _ = complete(prefill.url, decode.url, "smol-ninety", ids, SAMPLING)
    assert answer["cached_tokens"] == cached * BLOCK
    assert tuple(got) == c.want
