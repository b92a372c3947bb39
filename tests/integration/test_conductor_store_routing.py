"""The conductor routes on the store's own object events: a real store master publishing them
(`--kv-events`), a real store client in its own process putting and removing our KV block
objects, and a conductor following the master (`--store-events`). The leading blocks of a
request that the store holds are a prefix any prefill worker can fetch: the decision fetches
exactly those, from the store, and the explain record says how many the store held. Nothing
was placed by this conductor, so nothing else could have told it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mooncake_cli.conductor.event_routing import STORE
from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.http import jsonhttp
from mooncake_cli.kvkeys import block_keys
from mooncake_cli.scheduler.state import Request
from tests.conftest import wait_for
from tests.helpers.indexer_calls import AUTH, SECRET, publisher_factory, vh
from tests.helpers.kv_publisher import Publisher, removed, stored
from tests.helpers.store_procs import HERE, Proc, proc_list

BS = 16
T = list(range(1000, 1100))  # 6 whole blocks and a part


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    yield from proc_list()


@pytest.fixture
def publishers() -> Iterator[Callable[..., Publisher]]:
    yield from publisher_factory()


@pytest.fixture
def store(procs: list[Proc]) -> tuple[Proc, Proc]:
    master = Proc([sys.executable, "-m", "mooncake_cli", "--json", "store", "master",
                   "--port", "0", "--kv-events", "tcp://127.0.0.1:0"])
    procs.append(master)
    node = Proc([sys.executable, str(HERE / "store_kv_node.py"), "--master",
                 master.ready["address"]])
    procs.append(node)
    return master, node


@pytest.fixture
def conductor(store: tuple[Proc, Proc], tmp_path: Path) -> Iterator[ConductorService]:
    master, _ = store
    cfg = ConductorConfig(port=0, model="demo", block_size=BS, instance_ttl=600,
                          explain=str(tmp_path / "explain.jsonl"),
                          store_events=master.ready["kv_events"],
                          store_events_replay=master.ready["kv_events_replay"])
    svc = ConductorService(cfg, secret=SECRET).start()
    for name, role in (("a", "prefill"), ("b", "prefill"), ("d", "decode")):
        ans = jsonhttp.call(svc.url + "/v1/instances/register",
                            {"name": name, "role": role, "url": "http://127.0.0.1:9"}, auth=AUTH)
        assert ans.status == 200, ans.body
    yield svc
    svc.close()


def ask(p: Proc, **cmd: Any) -> None:
    ans = p.ask(**cmd)
    assert ans["ok"], ans


def decide(svc: ConductorService) -> dict[str, Any]:
    """One decision for T, booked and released: its explain record."""
    sreq = Request("r", len(T), 4, block_keys(T, svc.conductor.model.ns), T)
    decision = svc.conductor.bookings.decide(sreq)
    svc.conductor.bookings.unbook(decision, sreq)
    record: dict[str, Any] = json.loads(Path(svc.cfg.explain).read_text().splitlines()[-1])
    return record


def in_store(svc: ConductorService, keys: list[str]) -> int:
    return svc.indexer.store_depth(keys)["longest"]


def test_a_prefix_the_store_holds_is_fetched_from_it(store, conductor) -> None:
    _, node = store
    svc = conductor
    keys = block_keys(T, svc.conductor.model.ns)
    before = decide(svc)
    assert before["kv_events"] == {STORE: 0}
    assert before["prefill"]["fetch_blocks"] == 0

    for key in keys[:4]:
        ask(node, cmd="put", key=key, size=4096)
    wait_for(lambda: in_store(svc, keys) == 4, 30, 0.05, "the store's events")
    record = decide(svc)
    assert record["kv_events"] == {STORE: 4}
    chosen = record["prefill"]
    assert (chosen["local_blocks"], chosen["fetch_blocks"], chosen["fetch_from"]) == \
        (0, 4, STORE)

    ask(node, cmd="remove", key=keys[2])  # the store's prefix is now two blocks
    wait_for(lambda: in_store(svc, keys) == 2, 30, 0.05, "the removal event")
    record = decide(svc)
    assert record["kv_events"] == {STORE: 2}
    assert (record["prefill"]["fetch_blocks"], record["prefill"]["fetch_from"]) == (2, STORE)


def engine_key(h: str) -> str:
    """The object key vLLM's MooncakeStoreConnector puts a block under (vLLM's hash `h`)."""
    return f"m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{h.removeprefix('b:')}"


@pytest.mark.parametrize("as_int", [True, False], ids=["int-hashes", "byte-hashes"])
def test_blocks_vllm_saved_in_the_store_are_joined_with_its_events(store, conductor,
                                                                   publishers, as_int) -> None:
    """A vLLM prefill worker's events name its blocks' hashes with their tokens (by default
    the low 64 bits as an int, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES; else the whole hash); the
    store's events name the objects vLLM's store connector put, by the whole hash. Once the
    worker evicted the blocks from its own cache, the store still has them for anyone to
    fetch."""
    _, node = store
    svc = conductor
    pub = publishers()
    ans = jsonhttp.call(svc.url + "/v1/instances/register", {
        "name": "v", "role": "prefill", "url": "http://127.0.0.1:9",
        "kv_events": {"endpoint": pub.pub, "replay_endpoint": pub.replay, "block_size": BS}},
        auth=AUTH)
    assert ans.status == 200, ans.body
    pub.wait_subscribers(1)
    hv = [vh("v", i) for i in range(5)]
    named = [int(h[2:], 16) & (1 << 64) - 1 if as_int else h for h in hv]  # as vLLM sends them
    pub.publish([stored(named, T[:80], BS)])
    for h in hv[:3]:  # the store connector saved the first three
        ask(node, cmd="put", key=engine_key(h), size=4096)
    wait_for(lambda: decide(svc)["kv_events"] == {"v": 5, STORE: 3}, 30, 0.05,
             "both streams")
    assert decide(svc)["prefill"]["instance"] == "v"

    pub.publish([removed(named)])  # vLLM evicted all five from its own cache
    wait_for(lambda: decide(svc)["kv_events"] == {"v": 0, STORE: 3}, 30, 0.05, "the eviction")
    chosen = decide(svc)["prefill"]
    assert (chosen["local_blocks"], chosen["fetch_blocks"], chosen["fetch_from"]) == \
        (0, 3, STORE)
    ask(node, cmd="remove", key=engine_key(hv[1]))  # a hole: only the first block is whole
    wait_for(lambda: decide(svc)["kv_events"] == {"v": 0, STORE: 1}, 30, 0.05, "the removal")
