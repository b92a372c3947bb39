"""Fixtures: a real store master and a real store node, each in its own process (the same
commands a user runs), and a plain StoreClient in the test process to inspect the store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mooncake_cli.config import TransferConfig
from mooncake_cli.registry import Registry
from mooncake_cli.store.client import StoreClient
from mooncake_cli.transfer.engine import TransferEngine

from mooncake_lmcache.procs import StoreProcs
from tests.conftest import free_port


@pytest.fixture
def store() -> Iterator[StoreProcs]:
    """A master (`mooncake store master`, 30 s leases, dead clients dropped after 3 s) and one
    node contributing 256 MiB (`mooncake store serve`)."""
    procs = StoreProcs(free_port(), "--lease-ttl", "30", "--client-ttl", "3")
    try:
        procs.add_node(256 << 20)
        yield procs
    finally:
        procs.close()


@pytest.fixture
def inspector(store: StoreProcs) -> Iterator[StoreClient]:
    """A StoreClient contributing nothing, to look at what the plugin left in the store."""
    engine = TransferEngine(TransferConfig(), Registry())
    client = StoreClient(store.master, engine, 0, timeout=3)
    try:
        yield client
    finally:
        client.close()
        engine.close()
