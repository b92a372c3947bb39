"""Prefetch on a prefill worker against a real store master (in this process): two workers share
the store, a stores a prompt's blocks, b pulls them into its own segment while the request waits
-- asked over HTTP (the conductor's queue) or on its own while it is busy -- and the prefill then
reads the prefix with local copies only; a cancelled prefetch pulls nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.http.jsonhttp import call
from mooncake_cli.http.server import Server, edge_app
from mooncake_cli.kvkeys import block_keys
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.service import MasterService
from mooncake_cli.worker.prefill import PrefillWorker
from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(120)
BS = 8
CFG = WorkerConfig(role="prefill", segment_size=8 << 20, block_size=BS, chunk_size=24)


@pytest.fixture
def pair() -> Iterator[tuple[PrefillWorker, PrefillWorker]]:
    with MasterService(StoreMaster(), "127.0.0.1", 0) as master, \
            PrefillWorker(dataclasses.replace(CFG, store=master.address, name="a")) as a, \
            PrefillWorker(dataclasses.replace(CFG, store=master.address, name="b")) as b:
        yield a, b


def prompt(salt: int) -> list[int]:
    return [256, *((i * 7 + salt) % 256 for i in range(6 * BS + 2))]


def run(w: PrefillWorker, rid: str, ids: list[int], reuse: str = "any",
        decode: str | None = None) -> Any:
    return call(w.url + "/v1/prefill", {"request_id": rid, "token_ids": ids, "reuse": reuse,
                                        "decode": decode, "sampling": {"max_tokens": 2}},
                timeout=60)


def segments(w: PrefillWorker, keys: list[str]) -> list[set[str]]:
    assert w.store is not None
    return [{r.segment for r in w.store.describe(k).replicas} for k in keys]


def test_a_prefetched_prefix_is_read_with_local_copies(
        pair: tuple[PrefillWorker, PrefillWorker]) -> None:
    a, b = pair
    ids = prompt(3)
    keys = block_keys(ids, b.ns)
    cold = run(a, "cold", ids, "local").body
    assert cold["stored_keys"] == keys
    asked = call(b.url + "/v1/prefetch", {"request_id": "r1", "token_ids": ids})
    assert asked.status == 200 and asked.body["started"] is True, asked.body
    assert b.prefetch is not None and a.store is not None and b.store is not None
    wait_for(lambda: (p := b.prefetch.get("r1")) is not None and p.finished.is_set(), 30)
    pull = b.prefetch.get("r1")
    assert pull is not None and (pull.state, pull.held, pull.pulled) == ("done", 0, 6)
    both = {a.store.engine.name, b.store.engine.name}
    assert segments(b, keys) == [both] * 6
    answer = run(b, "r1", ids).body
    assert answer["prefetched"] == 6 and answer["cached_tokens"] == 6 * BS, answer
    assert answer["fetched"] == [], "every block was read from b's own segment"
    assert answer["replicated_keys"] == [] and answer["first_token"] == cold["first_token"]
    assert b.metrics.get("prefetched_blocks") == 6 and b.prefetch.get("r1") is None


def test_a_busy_worker_prefetches_a_request_queued_behind(
        pair: tuple[PrefillWorker, PrefillWorker]) -> None:
    """b's first request holds it (its decode worker has not answered the reservation yet);
    the second, queued behind, has its prefix pulled meanwhile."""
    a, b = pair
    ids = prompt(5)
    run(a, "cold", ids, "local")
    reserving, go = threading.Event(), threading.Event()

    async def reserve(request: Request) -> JSONResponse:
        reserving.set()
        await asyncio.to_thread(go.wait, 60)
        return JSONResponse({"error": {"message": "no room", "type": "unavailable"}}, 503)

    decode = Server(edge_app([Route("/v1/kv/reserve", reserve, methods=["POST"])]),
                    "127.0.0.1", 0, "held-decode").start()
    try:
        first: list[Any] = []
        holder = threading.Thread(target=lambda: first.append(
            run(b, "first", prompt(9), decode=f"http://127.0.0.1:{decode.port}")))
        holder.start()
        assert reserving.wait(30)
        second: list[Any] = []
        waiter = threading.Thread(target=lambda: second.append(run(b, "second", ids)))
        waiter.start()
        assert b.prefetch is not None
        wait_for(lambda: (p := b.prefetch.get("second")) is not None and p.finished.is_set(),
                 30)
        pull = b.prefetch.get("second")
        assert pull is not None and (pull.reason, pull.pulled) == ("busy", 6)
        go.set()
        holder.join(60)
        waiter.join(60)
    finally:
        go.set()
        decode.close()
    assert first[0].status == 502 and "refused the KV reservation" in str(first[0].body)
    answer = second[0].body
    assert answer["prefetched"] == 6 and answer["fetched"] == [], answer
    assert answer["cached_tokens"] == 6 * BS


def test_a_cancelled_prefetch_pulls_nothing(pair: tuple[PrefillWorker, PrefillWorker]) -> None:
    a, b = pair
    ids = prompt(7)
    keys = block_keys(ids, b.ns)
    run(a, "cold", ids, "local")
    assert b.prefetch is not None and a.store is not None
    with b.prefetch.loading():  # as while a prefill loads: no chunk starts
        assert call(b.url + "/v1/prefetch", {"request_id": "r", "token_ids": ids}
                    ).body["started"] is True
        pull = b.prefetch.get("r")
        gone = call(b.url + "/v1/prefetch/cancel", {"request_id": "r"})
        assert gone.status == 200 and gone.body["started"] is True
    assert pull is not None and pull.finished.wait(30)
    assert (pull.state, pull.pulled) == ("stopped", 0)
    assert segments(b, keys) == [{a.store.engine.name}] * 6
    assert b.metrics.get("prefetches_cancelled") == 1
    again = call(b.url + "/v1/prefetch/cancel", {"request_id": "r"})
    assert again.body["started"] is False, "nothing left to cancel"
    bad = call(b.url + "/v1/prefetch", {"request_id": "x", "token_ids": []})
    assert bad.status == 400 and bad.body["error"]["param"] == "token_ids"
