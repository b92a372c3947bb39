"""mooncake_cli.compat.store against a real master process: a port of upstream's typical
`mooncake.store` usage (setup, put/get/is_exist/remove, batches, zero copy through pointers)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import numpy as np
import pytest

from mooncake_cli.compat.store import MooncakeDistributedStore, ReplicateConfig
from tests.conftest import free_port
from tests.helpers.store_procs import Proc, start_master

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20


@pytest.fixture(scope="module")
def master() -> Iterator[str]:
    m: Proc = start_master(free_port())
    yield str(m.ready["address"])
    assert m.stop() == 0


@pytest.fixture
def store(master: str) -> Iterator[MooncakeDistributedStore]:
    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", 64 * MiB, 16 * MiB, "tcp", "", master)
    assert rc == 0
    yield s
    s.remove_all(force=True)
    assert s.close() == 0


def test_setup_with_a_dict_and_size_strings(master: str) -> None:
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "p2p",
                    "global_segment_size": "16MB", "local_buffer_size": "16MB",
                    "protocol": "tcp", "rdma_devices": "", "master_server_addr": master}) == 0
    try:
        host, _, port = s.get_hostname().rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
        assert s.put("dict-key", b"hello") == 0
        assert s.get("dict-key") == b"hello"
        assert s.remove("dict-key") == -706  # the get leased it
        assert s.remove("dict-key", force=True) == 0
    finally:
        s.close()


def test_setup_refuses_nonsense(master: str) -> None:
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "p2p", "lots", "16MB", "tcp", "", master) == -600
    assert s.setup("localhost", "ftp://nowhere", "16MB", "16MB", "tcp", "", master) == -600
    # an HA master address whose etcd cannot be reached
    assert s.setup("localhost", "p2p", "16MB", "16MB", "tcp", "", "etcd://h:2379") == -900
    assert s.put("k", b"v") < 0 and s.get("k") == b"" and s.is_exist("k") == -1
    assert s.close() == 0


def test_dead_master_fails_fast() -> None:
    s = MooncakeDistributedStore()
    t0 = time.monotonic()
    rc = s.setup("localhost", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "",
                 f"127.0.0.1:{free_port()}")
    assert rc == -900 and time.monotonic() - t0 < 3
    assert s.close() == 0


def test_put_get_exist_remove(store: MooncakeDistributedStore) -> None:
    value = np.random.default_rng(1).bytes(300_000)
    assert store.put("a", value) == 0
    assert store.is_exist("a") == 1
    assert store.get_size("a") == len(value)
    assert store.get("a") == value
    assert store.put("a", b"again") == 0  # an existing key: a success, as upstream
    assert store.get("a") == value  # and the object unchanged
    assert store.remove("a", force=True) == 0
    assert store.is_exist("a") == 0
    assert store.get("a") == b""
    assert store.get_size("a") == -704
    assert store.remove("a") == -704


def test_replicate_config_and_lease(store: MooncakeDistributedStore) -> None:
    config = ReplicateConfig()
    config.replica_num = 1
    config.with_hard_pin = True
    config.preferred_segment = store.get_hostname()
    assert store.put("pinned", b"x" * 4096, config) == 0
    assert store.get("pinned") == b"x" * 4096  # a get grants a lease
    assert store.remove("pinned") == -706
    assert store.remove("pinned", force=True) == 0
    bad = ReplicateConfig()
    bad.replica_num = 0
    assert store.put("bad", b"v", bad) == -600


def test_batches(store: MooncakeDistributedStore) -> None:
    keys = [f"batch-{i}" for i in range(8)]
    values = [bytes([i]) * (1000 * (i + 1)) for i in range(8)]
    assert store.put_batch(keys, values) == 0
    assert store.batch_is_exist([*keys, "missing"]) == [1] * 8 + [0]
    assert store.get_batch([*keys, "missing"]) == [*values, b""]
    assert store.put_batch(["x"], [b"1", b"2"]) == -600
    assert store.remove_all(force=True) == 8
    assert store.batch_is_exist(keys) == [0] * 8


def test_zero_copy_through_pointers(store: MooncakeDistributedStore) -> None:
    rng = np.random.default_rng(2)
    src = rng.integers(0, 256, 4 * MiB, dtype=np.uint8)
    dst = np.zeros(4 * MiB, dtype=np.uint8)
    for arr in (src, dst):
        assert store.register_buffer(arr.ctypes.data, arr.nbytes) == 0
    assert store.register_buffer(src.ctypes.data, src.nbytes) == -600  # twice
    assert store.put_from("zc", src.ctypes.data, src.nbytes) == 0
    assert store.get_into("zc", dst.ctypes.data, dst.nbytes) == src.nbytes
    assert np.array_equal(src, dst)
    assert store.get_into("zc", dst.ctypes.data, 100) == -600  # buffer too small
    assert store.get_into("nope", dst.ctypes.data, dst.nbytes) == -704

    chunk = MiB
    keys = [f"zc-{i}" for i in range(4)]
    ptrs = [src.ctypes.data + i * chunk for i in range(4)]
    assert store.batch_put_from(keys, ptrs, [chunk] * 4) == [0] * 4
    dst[:] = 0
    out = [dst.ctypes.data + (3 - i) * chunk for i in range(4)]  # reversed order
    assert store.batch_get_into([*keys, "nope"], [*out, dst.ctypes.data],
                                [chunk] * 5) == [chunk] * 4 + [-704]
    for i in range(4):
        assert np.array_equal(dst[(3 - i) * chunk:(4 - i) * chunk], src[i * chunk:(i + 1) * chunk])
    assert store.batch_put_from(["a", "b"], [src.ctypes.data], [1, 2]) == [-600, -600]
    for arr in (src, dst):
        assert store.unregister_buffer(arr.ctypes.data) == 0
    assert store.unregister_buffer(src.ctypes.data) == -600


def test_between_two_clients(master: str, store: MooncakeDistributedStore) -> None:
    other = MooncakeDistributedStore()
    assert other.setup("localhost", "P2PHANDSHAKE", "16MB", "4MB", "tcp", "", master) == 0
    try:
        config = ReplicateConfig()
        config.preferred_segment = other.get_hostname()
        value = np.random.default_rng(3).bytes(2 * MiB + 7)
        assert other.put("shared", value, config) == 0
        assert store.get("shared") == value
        buf = np.zeros(len(value), dtype=np.uint8)
        assert store.get_into("shared", buf.ctypes.data, buf.nbytes) == len(value)
        assert buf.tobytes() == value
    finally:
        other.close()


def _rdma_here() -> bool:
    from mooncake_backends.nixl import ucx

    return bool(ucx.fast_paths()[0])


@pytest.mark.skipif(_rdma_here(), reason="an RDMA device: protocol rdma runs on nixl here")
def test_rdma_without_a_device_runs_on_what_the_warning_names(
        master: str, store: MooncakeDistributedStore, caplog: pytest.LogCaptureFixture) -> None:
    from mooncake_backends.nixl import ucx

    other = MooncakeDistributedStore()
    with caplog.at_level(logging.WARNING, logger="mooncake.compat"):
        assert other.setup("localhost", "P2PHANDSHAKE", "16MB", "4MB", "rdma", "", master) == 0
    try:
        (line,) = [r.getMessage() for r in caplog.records if "protocol rdma" in r.getMessage()]
        why = ("UCX (the nixl plugin) finds no RDMA device" if ucx.find_module()[0]
               else "the nixl plugin, the only RDMA path, is unavailable")
        assert why in line, line
        config = ReplicateConfig()
        config.preferred_segment = store.get_hostname()
        value = np.random.default_rng(4).bytes(MiB + 3)
        assert store.put("over-rdma", value, config) == 0
        assert other.get("over-rdma") == value  # read from the first store's segment
        assert other._conn.engine is not None
        used = other._conn.engine.transport_for(store.get_hostname())
        named = line.split("transfers use ")[1].split(" instead")[0].split(", ")
        assert used in named and used != "nixl", (used, line)
    finally:
        other.close()
