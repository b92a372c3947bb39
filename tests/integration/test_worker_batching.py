"""Decode and prefill workers in this process (demo model, no store): continuous batching gives
each request its single-request tokens, admission refuses what would overflow the cache, bad
bodies are 400s, a client that leaves frees its blocks."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.engine import KVCache, ModelRunner, SamplingParams
from mooncake_cli.http.jsonhttp import call, events
from mooncake_cli.worker.decode import DecodeWorker
from mooncake_cli.worker.prefill import PrefillWorker
from tests.conftest import wait_for
from tests.helpers.prom import value
from tests.helpers.worker_procs import complete

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[PrefillWorker, DecodeWorker]]:
    prefill = PrefillWorker(WorkerConfig(role="prefill", block_size=8, chunk_size=16))
    decode = DecodeWorker(WorkerConfig(role="decode", block_size=8, kv_blocks=96))
    with prefill, decode:
        yield prefill, decode


def prompts() -> list[list[int]]:
    text = "Continuous batching lets requests join and leave between decode steps. "
    return [[256, *(text * 3).encode()[:n]] for n in (3, 17, 40, 64, 90)]


def test_concurrent_requests_equal_their_single_outputs(
        workers: tuple[PrefillWorker, DecodeWorker]) -> None:
    prefill, decode = workers
    lengths = [12, 30, 7, 24, 18]
    sampling = [{"max_tokens": n, "ignore_eos": True} for n in lengths]
    sampling[3] = {"max_tokens": 24, "ignore_eos": True, "temperature": 0.8, "top_p": 0.9,
                   "seed": 7}
    alone = [complete(prefill.url, decode.url, f"alone-{i}", p, s)[1]
             for i, (p, s) in enumerate(zip(prompts(), sampling, strict=True))]
    assert [len(a) for a in alone] == lengths
    steps_before = decode.metrics.steps()
    together: list[list[int]] = [[] for _ in lengths]
    all_prefilled = threading.Barrier(len(lengths))  # then all decode at once

    def run(i: int) -> None:
        together[i] = complete(prefill.url, decode.url, f"together-{i}", prompts()[i],
                               sampling[i], between=lambda: all_prefilled.wait(60))[1]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(lengths))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert together == alone
    steps = decode.metrics.steps() - steps_before
    assert steps < sum(lengths) - len(lengths), "requests shared decode steps"
    assert decode.load()["free_blocks"] == 96


def test_reservations_take_the_prompts_blocks_and_keep_the_watermark(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mooncake_cli.worker import kvgrant

    monkeypatch.setattr(kvgrant, "MAX_UNUSED_SHARE", 1.0)  # one requester may fill the cache
    with DecodeWorker(WorkerConfig(role="decode", block_size=16, kv_blocks=8)) as decode:
        url = decode.url + "/v1/kv/reserve"
        big = call(url, {"request_id": "too-big", "num_tokens": 100, "max_tokens": 100})
        assert big.status == 413 and "needs 13 KV blocks" in big.body["error"]["message"]
        # the prompt's block only: growing to 5 blocks is allocated as it happens
        first = call(url, {"request_id": "a", "num_tokens": 16, "max_tokens": 64})
        assert first.status == 200 and len(first.body["block_ids"]) == 1
        assert decode.load()["free_blocks"] == 7
        second = call(url, {"request_id": "b", "num_tokens": 64, "max_tokens": 64})
        assert second.status == 200 and len(second.body["block_ids"]) == 4
        full = call(url, {"request_id": "c", "num_tokens": 48})
        assert full.status == 503, "3 blocks are free, but 1 is kept for growth"
        assert "KV cache full" in full.body["error"]["message"]
        fits = call(url, {"request_id": "c", "num_tokens": 32})
        assert fits.status == 200 and len(fits.body["block_ids"]) == 2
        assert call(url, {"request_id": "c", "num_tokens": 1}).status == 409
        assert call(decode.url + "/v1/kv/release", {"request_id": "a"}).body == \
            {"request_id": "a", "released_blocks": 1}
        assert call(url, {"request_id": "d", "num_tokens": 16}).status == 200
        assert call(decode.url + "/v1/kv/release", {"request_id": "a"}).status == 404


@pytest.mark.parametrize("body,param", [
    ({"token_ids": [1, 2]}, "request_id"),
    ({"request_id": "x"}, "token_ids"),
    ({"request_id": "x", "token_ids": "1 2 3"}, "token_ids"),
    ({"request_id": "x", "token_ids": [1, -2]}, "token_ids"),
    ({"request_id": "x", "token_ids": [1, 99999]}, "token_ids"),
    ({"request_id": "x", "token_ids": [1], "sampling": {"temperature": "hot"}},
     "sampling.temperature"),
    ({"request_id": "x", "token_ids": [1], "sampling": {"max_tokens": 0}}, "sampling"),
    ({"request_id": "x", "token_ids": [1], "decode": 5}, "decode"),
])
def test_malformed_prefill_body_is_400(workers: tuple[PrefillWorker, DecodeWorker],
                                       body: dict[str, Any], param: str) -> None:
    prefill, _ = workers
    answer = call(prefill.url + "/v1/prefill", body)
    assert answer.status == 400, answer.body
    assert answer.body["error"]["param"] == param
    assert prefill.load()["waiting"] == 0


def test_not_json_is_400_and_the_worker_still_serves(
        workers: tuple[PrefillWorker, DecodeWorker]) -> None:
    prefill, _ = workers
    conn = http.client.HTTPConnection("127.0.0.1", prefill.http.port, timeout=10)
    conn.request("POST", "/v1/prefill", body=b"{not json", headers={"Content-Length": "9"})
    assert conn.getresponse().status == 400
    conn.close()
    ok = call(prefill.url + "/v1/prefill", {"request_id": "after", "token_ids": [256, 65]})
    assert ok.status == 200 and ok.body["prompt_tokens"] == 2


def test_generate_needs_a_reservation(workers: tuple[PrefillWorker, DecodeWorker]) -> None:
    _, decode = workers
    answer = call(decode.url + "/v1/generate", {"request_id": "nobody", "token_ids": [256],
                                                "first_token": 1})
    assert answer.status == 404 and "/v1/kv/reserve" in answer.body["error"]["message"]


def test_client_that_leaves_frees_its_blocks(workers: tuple[PrefillWorker, DecodeWorker]) -> None:
    prefill, decode = workers
    ids = prompts()[4]
    sampling = {"max_tokens": 600, "ignore_eos": True}
    answer = call(prefill.url + "/v1/prefill", {"request_id": "leaver", "token_ids": ids,
                                                "sampling": sampling, "decode": decode.url})
    assert answer.status == 200
    conn = http.client.HTTPConnection("127.0.0.1", decode.http.port, timeout=10)
    conn.request("POST", "/v1/generate", body=json.dumps(
        {"request_id": "leaver", "token_ids": ids, "first_token": answer.body["first_token"],
         "sampling": sampling}), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.readline().startswith(b"data: {\"token\"")
    wait_for(lambda: decode.load()["running"] == 1, 10, what="the request to run")
    generated = decode.metrics.get("generated_tokens")
    cancelled = decode.metrics.get("requests_failed")
    resp.close()
    conn.close()
    wait_for(lambda: {k: decode.load()[k] for k in ("running", "waiting", "preempted",
                                                     "free_blocks", "total_blocks")} ==
             {"running": 0, "waiting": 0, "preempted": 0, "free_blocks": 96,
              "total_blocks": 96}, 20, what="the cancelled request's blocks to be freed")
    assert decode.metrics.get("requests_failed") == cancelled + 1
    assert decode.metrics.get("generated_tokens") < generated + 500, "it stopped early"
    assert value(call(decode.url + "/metrics").body["text"], "mooncake_worker_free_blocks",
                 role="decode") == 96


def test_seeded_sampling_across_prefill_and_decode_equals_one_process(
        workers: tuple[PrefillWorker, DecodeWorker]) -> None:
    prefill, decode = workers
    sampling = {"max_tokens": 20, "temperature": 0.9, "top_k": 50, "top_p": 0.95, "seed": 42,
                "ignore_eos": True}
    ids = prompts()[2]
    runner = ModelRunner(prefill.model, KVCache(prefill.model.namespace(8), 32))
    [seq] = runner.generate([ids], SamplingParams(max_tokens=20, temperature=0.9, top_k=50,
                                                  top_p=0.95, seed=42, ignore_eos=True))
    first = complete(prefill.url, decode.url, "seeded-1", ids, sampling)[1]
    again = complete(prefill.url, decode.url, "seeded-2", ids, sampling)[1]
    assert first == again == seq.output_ids
    other = complete(prefill.url, decode.url, "seeded-3", ids, {**sampling, "seed": 43})[1]
    assert other != first


def test_shutdown_fails_unfinished_requests_clearly(
        workers: tuple[PrefillWorker, DecodeWorker]) -> None:
    prefill, _ = workers
    decode = DecodeWorker(WorkerConfig(role="decode", block_size=8, kv_blocks=96,
                                       drain_timeout=0.3)).start()
    try:
        ids = prompts()[1]
        sampling = {"max_tokens": 600, "ignore_eos": True}
        answer = call(prefill.url + "/v1/prefill", {"request_id": "cut", "token_ids": ids,
                                                    "sampling": sampling, "decode": decode.url})
        got: list[dict[str, Any]] = []
        reader = threading.Thread(target=lambda: got.extend(events(
            decode.url + "/v1/generate", {"request_id": "cut", "token_ids": ids,
                                          "first_token": answer.body["first_token"],
                                          "sampling": sampling})))
        reader.start()
        wait_for(lambda: decode.load()["running"] == 1, 10, what="the request to run")
    finally:
        decode.close()
    reader.join(10)
    assert got[-1]["finish_reason"] == "error"
    assert "shutting down" in got[-1]["error"]
    assert 1 < got[-1]["completion_tokens"] < 600
    assert decode.cache.allocator.free == 96
