"""Prefix reuse against a real store master (in this process): only the leading run of stored
blocks is reused, a block gone between lookup and load is computed instead, and a decode worker
that vanishes after reserving fails the request clearly while the worker keeps serving."""

from __future__ import annotations

import dataclasses
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
from mooncake_cli.kvkeys import block_keys
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.service import MasterService
from mooncake_cli.worker.prefill import PrefillWorker
from tests.conftest import free_port

pytestmark = pytest.mark.timeout(120)
BS = 8


@pytest.fixture(scope="module")
def worker() -> Iterator[PrefillWorker]:
    with MasterService(StoreMaster(), "127.0.0.1", 0) as master, PrefillWorker(
            WorkerConfig(role="prefill", store=master.address, segment_size=8 << 20,
                         block_size=BS, chunk_size=24)) as w:
        yield w


def prefill(w: PrefillWorker, rid: str, ids: list[int], decode: str | None = None) -> Any:
    return call(w.url + "/v1/prefill", {"request_id": rid, "token_ids": ids, "decode": decode,
                                        "sampling": {"max_tokens": 4}})


def prompt(n: int, salt: int) -> list[int]:
    return [256, *((i * 7 + salt) % 256 for i in range(n - 1))]


def test_only_the_leading_run_of_stored_blocks_is_reused(worker: PrefillWorker) -> None:
    ids = prompt(10 * BS, 1)  # exactly 10 blocks
    cold = prefill(worker, "cold", ids).body
    assert cold["cached_tokens"] == 0 and len(cold["stored_keys"]) == 10
    again = prefill(worker, "again", ids).body
    assert again["cached_tokens"] == 9 * BS, "the last block is computed for its logits"
    assert again["first_token"] == cold["first_token"] and again["stored_keys"] == []
    keys = block_keys(ids, worker.ns)
    assert keys == cold["stored_keys"]
    assert worker.store is not None
    worker.store.remove(keys[4], force=True)  # leased by the last read
    holed = prefill(worker, "holed", ids).body
    assert holed["cached_tokens"] == 4 * BS
    assert holed["first_token"] == cold["first_token"]
    assert holed["stored_keys"] == [keys[4]], "blocks after the hole exist already"


def test_prompt_shorter_than_a_block(worker: PrefillWorker) -> None:
    body = prefill(worker, "short", prompt(BS - 3, 2)).body
    assert body["cached_tokens"] == 0 and body["stored_keys"] == []
    again = prefill(worker, "short-2", prompt(BS - 3, 2)).body
    assert again["cached_tokens"] == 0 and again["first_token"] == body["first_token"]

def test_block_removed_between_lookup_and_load(worker: PrefillWorker,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ids = prompt(12 * BS + 3, 3)
    cold = prefill(worker, "race-cold", ids).body
    assert worker.store is not None
    store = worker.store
    keys = block_keys(ids, worker.ns)
    lookup = store.batch_exists

    def lookup_then_evict(k: list[str]) -> list[Any]:
        found = lookup(k)
        store.remove(keys[6], force=True)  # gone after the lookup said it was there
        return found

    monkeypatch.setattr(store, "batch_exists", lookup_then_evict)
    raced = prefill(worker, "race", ids).body
    assert raced["cached_tokens"] == 6 * BS
    assert raced["first_token"] == cold["first_token"]


def vanished_decode(state: dict[str, Any]) -> Starlette:
    """A decode worker that reserved blocks and then died: its transfer engine is gone."""

    async def reserve(request: Request) -> JSONResponse:
        got = json.loads(await body(request))
        dead = f"127.0.0.1:{state['port']}"
        blocks = -(-got["num_tokens"] // BS)  # what a real one reserves
        return JSONResponse({"segment": dead, "engine": dead, "block_ids": list(range(blocks)),
                             "block_bytes": state["block_bytes"], "base": 0})

    async def release(request: Request) -> JSONResponse:
        state["released"].append(json.loads(await body(request))["request_id"])
        return JSONResponse({})

    return edge_app([Route("/v1/kv/reserve", reserve, methods=["POST"]),
                     Route("/v1/kv/release", release, methods=["POST"])])


def test_decode_gone_while_streaming_fails_clearly(worker: PrefillWorker) -> None:
    state: dict[str, Any] = {"port": free_port(), "block_bytes": worker.ns.block_bytes,
                             "released": []}
    server = Server(vanished_decode(state), "127.0.0.1", 0, "vanished-decode").start()
    try:
        answer = prefill(worker, "doomed", prompt(5 * BS, 4), f"http://127.0.0.1:{server.port}")
    finally:
        server.close()
    assert answer.status == 502
    assert "streaming KV to 127.0.0.1:" in answer.body["error"]["message"], answer.body
    assert state["released"] == ["doomed"]
    ok = prefill(worker, "after-doomed", prompt(3 * BS, 5))
    assert ok.status == 200, "the worker keeps serving"
    assert worker.load()["free_blocks"] == worker.load()["total_blocks"]


def test_local_reuse_counts_only_blocks_in_the_own_segment() -> None:
    """Two workers share one store: what one stored is a hit for the other only when the
    conductor lets it fetch (reuse "any"), not with reuse "local"."""
    cfg = WorkerConfig(role="prefill", segment_size=8 << 20, block_size=BS, chunk_size=24)
    with MasterService(StoreMaster(), "127.0.0.1", 0) as master, \
            PrefillWorker(dataclasses.replace(cfg, store=master.address, name="a")) as a, \
            PrefillWorker(dataclasses.replace(cfg, store=master.address, name="b")) as b:
        ids = prompt(6 * BS, 9)

        def run(w: PrefillWorker, rid: str, reuse: str) -> Any:
            return call(w.url + "/v1/prefill", {"request_id": rid, "token_ids": ids,
                                                "reuse": reuse, "sampling": {"max_tokens": 2}})

        cold = run(a, "a-cold", "local").body
        assert cold["cached_tokens"] == 0 and len(cold["stored_keys"]) == 6
        assert run(a, "a-local", "local").body["cached_tokens"] == 5 * BS  # its own blocks
        assert run(b, "b-local", "local").body["cached_tokens"] == 0  # held by a only
        fetched = run(b, "b-any", "any").body
        assert fetched["cached_tokens"] == 5 * BS
        assert fetched["first_token"] == cold["first_token"]
        assert run(b, "b-none", "none").body["cached_tokens"] == 0
        bad = run(b, "b-bad", "everything")
        assert bad.status == 400 and bad.body["error"]["param"] == "reuse"


def test_fetched_blocks_gain_a_replica_in_the_own_segment() -> None:
    """Worker b fetches a's blocks (reuse "any") and keeps a replica of each in its own segment:
    the answer names them, the store lists both segments, and reuse "local" on b then hits."""
    cfg = WorkerConfig(role="prefill", segment_size=8 << 20, block_size=BS, chunk_size=24)
    with MasterService(StoreMaster(), "127.0.0.1", 0) as master, \
            PrefillWorker(dataclasses.replace(cfg, store=master.address, name="a")) as a, \
            PrefillWorker(dataclasses.replace(cfg, store=master.address, name="b")) as b:
        ids = prompt(6 * BS + 3, 11)
        keys = block_keys(ids, a.ns)

        def run(w: PrefillWorker, rid: str, reuse: str) -> Any:
            return call(w.url + "/v1/prefill", {"request_id": rid, "token_ids": ids,
                                                "reuse": reuse, "sampling": {"max_tokens": 2}})

        cold = run(a, "a-cold", "local").body
        assert cold["stored_keys"] == keys and cold["replicated_keys"] == []
        assert run(b, "b-local", "local").body["cached_tokens"] == 0  # held by a only
        fetched = run(b, "b-any", "any").body
        assert fetched["cached_tokens"] == 6 * BS
        assert fetched["replicated_keys"] == keys, fetched
        assert fetched["first_token"] == cold["first_token"]
        assert b.store is not None and a.store is not None
        for k in keys:
            held = {r.segment for r in b.store.describe(k).replicas}
            assert held == {a.store.engine.name, b.store.engine.name}, k
        local = run(b, "b-local-again", "local").body
        assert local["cached_tokens"] == 6 * BS, "the replicas in b's own segment count"
        assert local["first_token"] == cold["first_token"]
        again = run(b, "b-any-again", "any").body
        assert again["cached_tokens"] == 6 * BS and again["replicated_keys"] == []
        a.store.close()  # a's replicas are gone; b's serve on their own
        assert run(b, "b-alone", "local").body["cached_tokens"] == 6 * BS
