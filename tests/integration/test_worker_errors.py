"""Error paths of the workers in this process (demo model, no store): bad sampling values are
400s that give back the reserved KV blocks, a request that can never fit the decode worker is
told so (413 and code decode_too_large there and at the prefill), a malformed reservation answer is
refused and released, metrics print exact integers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.http.jsonhttp import call
from mooncake_cli.http.server import Server, body, edge_app
from mooncake_cli.worker.decode import DecodeWorker
from mooncake_cli.worker.metrics import WorkerMetrics
from mooncake_cli.worker.prefill import PrefillWorker
from tests.helpers.prom import helps, value

pytestmark = pytest.mark.timeout(120)
BLOCKS = 24


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[PrefillWorker, DecodeWorker]]:
    prefill = PrefillWorker(WorkerConfig(role="prefill", block_size=8, chunk_size=16))
    decode = DecodeWorker(WorkerConfig(role="decode", block_size=8, kv_blocks=BLOCKS))
    with prefill, decode:
        yield prefill, decode


PROMPT = [256, *b"error paths keep the cache whole"]


@pytest.mark.parametrize("sampling", [
    {"temperature": 1.0, "seed": 2**64},  # torch's manual_seed refuses it
    {"temperature": 1.0, "seed": -1},
    {"temperature": 1e-30},  # logits / temperature overflow to inf
    {"temperature": float("nan")},
    {"temperature": float("inf")},
])
def test_bad_sampling_at_generate_is_400_and_frees_the_reservation(
        workers: tuple[PrefillWorker, DecodeWorker], sampling: dict[str, Any]) -> None:
    _, decode = workers
    got = call(decode.url + "/v1/kv/reserve", {"request_id": "bad", "num_tokens": len(PROMPT)})
    assert got.status == 200 and decode.load()["free_blocks"] < BLOCKS
    answer = call(decode.url + "/v1/generate", {"request_id": "bad", "token_ids": PROMPT,
                                                "first_token": 65, "sampling": sampling})
    assert answer.status == 400, answer.body
    assert answer.body["error"]["param"] == "sampling"
    assert decode.load()["free_blocks"] == BLOCKS
    assert call(decode.url + "/v1/kv/release", {"request_id": "bad"}).status == 404


def test_ignore_eos_must_be_a_boolean(workers: tuple[PrefillWorker, DecodeWorker]) -> None:
    prefill, _ = workers
    answer = call(prefill.url + "/v1/prefill", {"request_id": "eos", "token_ids": PROMPT,
                                                "sampling": {"ignore_eos": "false"}})
    assert answer.status == 400 and answer.body["error"]["param"] == "sampling.ignore_eos"


def test_a_request_that_never_fits_the_decode_worker_is_told_so(
        workers: tuple[PrefillWorker, DecodeWorker]) -> None:
    prefill, decode = workers
    big = call(decode.url + "/v1/kv/reserve", {"request_id": "big", "num_tokens": len(PROMPT),
                                               "max_tokens": BLOCKS * 8})
    assert big.status == 413 and big.body["error"]["code"] == "decode_too_large"
    answer = call(prefill.url + "/v1/prefill", {
        "request_id": "big", "token_ids": PROMPT, "decode": decode.url,
        "sampling": {"max_tokens": BLOCKS * 8}})
    assert answer.status == 413, answer.body  # one code, one status, at every hop
    assert answer.body["error"]["code"] == "decode_too_large"
    assert decode.load()["free_blocks"] == BLOCKS


def short_reservations(decode_url: str) -> Starlette:
    """A proxy in front of a real decode worker that drops one block of every reservation."""

    async def reserve(request: Request) -> JSONResponse:
        got = await asyncio.to_thread(call, decode_url + "/v1/kv/reserve",
                                      json.loads(await body(request)))
        if got.status == 200:
            got.body["block_ids"] = got.body["block_ids"][:-1]
        return JSONResponse(got.body, got.status)

    async def release(request: Request) -> JSONResponse:
        got = await asyncio.to_thread(call, decode_url + "/v1/kv/release",
                                      json.loads(await body(request)))
        return JSONResponse(got.body, got.status)

    return edge_app([Route("/v1/kv/reserve", reserve, methods=["POST"]),
                     Route("/v1/kv/release", release, methods=["POST"])])


def test_a_reservation_of_the_wrong_size_is_refused_and_released(
        workers: tuple[PrefillWorker, DecodeWorker]) -> None:
    prefill, decode = workers
    proxy = Server(short_reservations(decode.url), "127.0.0.1", 0, "short-decode").start()
    try:
        answer = call(prefill.url + "/v1/prefill", {
            "request_id": "short", "token_ids": PROMPT,
            "decode": f"http://127.0.0.1:{proxy.port}"})
    finally:
        proxy.close()
    assert answer.status == 502 and answer.body["error"]["code"] == "decode_refused"
    assert "reserved" in answer.body["error"]["message"]
    assert decode.load()["free_blocks"] == BLOCKS  # the prefill gave it back


def test_metrics_print_exact_integers_and_exact_fractions() -> None:
    m = WorkerMetrics("decode", {"free_blocks": lambda: 1234567, "load": lambda: 0.1})
    m.add("kv_bytes_sent", 123456789012)
    text = m.render()
    assert value(text, "mooncake_worker_kv_bytes_sent_total", role="decode") == 123456789012
    assert value(text, "mooncake_worker_requests_total", role="decode") == 0
    assert value(text, "mooncake_worker_free_blocks", role="decode") == 1234567
    assert value(text, "mooncake_worker_load", role="decode") == 0.1
    assert all(helps(text).values()), "every metric has HELP text"
