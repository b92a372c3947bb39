"""Reads into memory registered with the engine land there directly, with no staging copy."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from mooncake_cli.store import ReplicateConfig
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import ChecksumMismatch
from tests.conftest import free_port
from tests.helpers.store_procs import Proc, start_master

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20


@pytest.fixture
def clients(make_engine: Callable[..., Any]) -> Iterator[Callable[[], StoreClient]]:
    master: Proc = start_master(free_port())
    made: list[StoreClient] = []

    def make() -> StoreClient:
        made.append(StoreClient(master.ready["address"], make_engine(timeout=3), 16 * MiB))
        return made[-1]

    yield make
    for c in made:
        c.close()
    assert master.stop() == 0


def test_a_read_into_registered_memory_is_not_staged(
        clients: Callable[[], StoreClient]) -> None:
    holder, reader = clients(), clients()
    data = os.urandom(3 * MiB + 5)
    holder.put("k", data, ReplicateConfig(preferred_segment=holder.engine.name))
    pool = np.zeros(8 * MiB, dtype=np.uint8)
    reader.engine.register(pool)
    into = pool[MiB + 3:MiB + 3 + len(data)]
    assert reader.batch_get_into(["k"], [into]) == [len(data)]
    assert into.tobytes() == data and not pool[:MiB + 3].any()
    assert reader.io._stage._region is None  # nothing went through the staging region
    elsewhere = np.zeros(len(data), dtype=np.uint8)  # not registered, but the peer is mapped
    assert reader.get_into("k", elsewhere) == len(data) and elsewhere.tobytes() == data
    assert reader.io._stage._region is None  # copied from the mapping, verified as it went


def test_a_read_from_an_unmapped_peer_into_plain_memory_is_staged(
        make_engine: Callable[..., Any]) -> None:
    master: Proc = start_master(free_port())
    holder = StoreClient(master.ready["address"], make_engine(timeout=3), 16 * MiB)
    reader = StoreClient(master.ready["address"], make_engine(timeout=3, transport="tcp"),
                         16 * MiB)
    try:
        data = os.urandom(3 * MiB + 5)
        holder.put("k", data, ReplicateConfig(preferred_segment=holder.engine.name))
        assert reader.io.near(reader.describe("k").replicas[0]) is None  # tcp maps nothing
        elsewhere = np.zeros(len(data), dtype=np.uint8)
        assert reader.get_into("k", elsewhere) == len(data) and elsewhere.tobytes() == data
        assert reader.io._stage._region is not None
    finally:
        reader.close()
        holder.close()
        assert master.stop() == 0


def test_a_bad_replica_in_a_mapped_peer_is_refused(clients: Callable[[], StoreClient]) -> None:
    holder, reader = clients(), clients()
    data = os.urandom(MiB + 7)
    holder.put("k", data, ReplicateConfig(preferred_segment=holder.engine.name))
    r = holder.describe("k").replicas[0]
    assert reader.io.near(r) is not None  # the reader maps the holder's segment
    held = holder.owner.region
    assert held is not None and held.view is not None
    held.view[r.offset - held.base + MiB + 3] ^= 0xFF  # in the last block
    with pytest.raises(ChecksumMismatch):
        reader.get_into("k", np.zeros(len(data), dtype=np.uint8))
    with pytest.raises(ChecksumMismatch):
        reader.get("k")
    assert isinstance(reader.batch_get_into(["k"], [np.zeros(len(data), np.uint8)])[0],
                      ChecksumMismatch)


def test_a_bad_replica_read_in_place_is_still_refused(
        clients: Callable[[], StoreClient]) -> None:
    holder, reader = clients(), clients()
    data = os.urandom(MiB)
    holder.put("k", data, ReplicateConfig(preferred_segment=holder.engine.name))
    r = holder.describe("k").replicas[0]
    assert holder.owner.region is not None and holder.owner.region.view is not None
    holder.owner.region.view[r.offset - holder.owner.region.base + 10] ^= 0xFF
    pool = np.zeros(2 * MiB, dtype=np.uint8)
    reader.engine.register(pool)
    with pytest.raises(ChecksumMismatch):
        reader.get_into("k", pool[:len(data)])
