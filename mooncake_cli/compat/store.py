"""Upstream's `mooncake.store` API over this project's store: change the import, keep the code.

    from mooncake_cli.compat.store import MooncakeDistributedStore, ReplicateConfig
    store = MooncakeDistributedStore()
    rc = store.setup("localhost", "P2PHANDSHAKE", "512MB", "128MB", "tcp", "", "127.0.0.1:50051")
    assert rc == 0 and store.put("k", b"v") == 0 and store.get("k") == b"v"

Like upstream, nothing here raises for a store failure: calls return 0 / a count / bytes read on
success and a negative upstream ErrorCode (mooncake_cli.store.errors) on failure; `get` returns
b"" and `is_exist` -1 when they fail. Pointers are integer addresses (numpy `arr.ctypes.data`),
read and written through ctypes: passing a bad address crashes the process, as it does upstream.
"""

from __future__ import annotations

import ctypes
import logging
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from mooncake_cli.config import TransferConfig, parse_size
from mooncake_cli.interfaces import ConfigError, MooncakeError
from mooncake_cli.registry import Registry
from mooncake_cli.store import records
from mooncake_cli.store.errors import ErrorCode, StoreError
from mooncake_cli.store.leader import LeaderResolver, is_ha
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region

__all__ = ["MooncakeDistributedStore", "ReplicateConfig"]
log = logging.getLogger("mooncake.compat")
T = TypeVar("T")
NOT_READY, BAD = int(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS), int(ErrorCode.INVALID_PARAMS)
MiB = 1 << 20


class ReplicateConfig:
    """Upstream's mutable placement config (attributes set after construction)."""

    def __init__(self) -> None:
        self.replica_num = 1
        self.with_soft_pin = False
        self.with_hard_pin = False
        self.preferred_segment = ""
        self.preferred_segments: list[str] = []

    def _native(self) -> records.ReplicateConfig:
        preferred = self.preferred_segment or next(iter(self.preferred_segments or []), "")
        return records.ReplicateConfig(int(self.replica_num), str(preferred),
                                       bool(self.with_soft_pin), bool(self.with_hard_pin))


def _native(config: Any) -> records.ReplicateConfig | None:
    if config is None or isinstance(config, records.ReplicateConfig):
        return config
    if isinstance(config, ReplicateConfig):
        return config._native()
    raise StoreError(f"config must be a ReplicateConfig, not {type(config).__name__}",
                     ErrorCode.INVALID_PARAMS)


def _code(e: BaseException) -> int:
    if isinstance(e, StoreError):
        return int(e.code)
    if isinstance(e, (ConfigError, ValueError, TypeError, OverflowError)):
        return BAD
    return int(ErrorCode.INTERNAL_ERROR)


def _view(ptr: int, size: int) -> memoryview:
    """A writable byte view of the `size` bytes at address `ptr`."""
    if not isinstance(ptr, int) or not isinstance(size, int) or ptr <= 0 or size <= 0:
        raise StoreError(f"bad buffer {ptr!r}, {size!r}", ErrorCode.INVALID_PARAMS)
    return memoryview((ctypes.c_ubyte * size).from_address(ptr)).cast("B")


def _metadata(url: str) -> str:
    if url.strip().lower() in ("p2phandshake", "p2p", ""):
        return "p2p"
    return url if "://" in url else f"etcd://{url}"  # upstream: a bare HOST:PORT is etcd


def _master_reachable(address: str, timeout: float) -> bool:
    """A quick TCP probe of HOST:PORT (of the leader an etcd://... address publishes), so a dead
    master fails setup at once (not after RPC timeouts) and a malformed address never reaches
    zmq. ConfigError for a malformed etcd:// address."""
    if is_ha(address):
        try:
            address = LeaderResolver(address, timeout).wait(time.monotonic() + timeout).address
        except StoreError:
            return False
    host, _, port = str(address).rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout).close()
    except (OSError, ValueError):
        return False
    return True


class MooncakeDistributedStore:
    """A store client with upstream's method names, arguments and integer return codes."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout  # seconds per master request (not an upstream argument)
        self._engine: TransferEngine | None = None
        self._client: Any = None  # mooncake_cli.store.client.StoreClient once set up
        self._hostname = ""
        self._buffers: dict[int, tuple[Region, memoryview]] = {}

    # -- setup / teardown ------------------------------------------------------------------------
    def setup(self, local_hostname: Any, metadata_server: str = "P2PHANDSHAKE",
              global_segment_size: int | str = 16 * MiB, local_buffer_size: int | str = 16 * MiB,
              protocol: str = "tcp", rdma_devices: str = "",
              master_server_addr: str = "127.0.0.1:50051", engine: object = None,
              **ignored: Any) -> int:
        """Start a transfer engine, contribute `global_segment_size` bytes; 0 or an error code.
        Also `setup(dict)` with the same names as keys."""
        if isinstance(local_hostname, dict):
            conf = dict(local_hostname)
            return self.setup(conf.pop("local_hostname", "localhost"), **conf)
        if self._client is not None:
            return NOT_READY
        try:
            segment = parse_size(global_segment_size)
            parse_size(local_buffer_size)  # upstream's staging buffer: not needed here
            host, _, port = str(local_hostname).rpartition(":")
            host, port = (host, port) if port.isdigit() else (str(local_hostname), "0")
            registry = Registry.from_env()
            names = registry.names("mooncake.transports")
            transport = protocol if protocol in names else "auto"
            if transport != protocol:
                log.warning("protocol %r is not available here: using %s", protocol, transport)
            config = TransferConfig(host=host or "127.0.0.1", port=int(port),
                                    metadata=_metadata(str(metadata_server)),
                                    transport=transport, timeout=self.timeout)
        except (MooncakeError, ValueError, TypeError) as e:
            log.error("setup: %s", e)
            return BAD
        if "://" in str(master_server_addr) and not is_ha(str(master_server_addr)):
            log.error("setup: master_server_addr must be HOST:PORT or etcd://HOST:PORT, not %s",
                      master_server_addr)
            return BAD
        try:  # etcd://...: the client follows the HA leader published there
            reachable = _master_reachable(str(master_server_addr), min(self.timeout, 2.0))
        except ConfigError as e:
            log.error("setup: %s", e)
            return BAD
        if not reachable:
            log.error("setup: no master answers at %s", master_server_addr)
            return int(ErrorCode.RPC_FAIL)
        try:
            from mooncake_cli.store.client import StoreClient

            self._engine = TransferEngine(config, registry)
            self._client = StoreClient(master_server_addr, self._engine, segment,
                                       timeout=self.timeout)
        except Exception as e:  # upstream reports a failed setup as a code, never raises
            log.error("setup: %s", e)
            self.close()
            return _code(e)
        self._hostname = self._engine.name
        return 0

    def close(self) -> int:
        for ptr in list(self._buffers):
            self.unregister_buffer(ptr)
        client, engine, self._client, self._engine = self._client, self._engine, None, None
        if client is not None:
            client.close()
        if engine is not None:
            engine.close()
        return 0

    def get_hostname(self) -> str:
        """This client's segment name (HOST:PORT), what `preferred_segment` takes."""
        return self._hostname

    # -- plumbing --------------------------------------------------------------------------------
    def _run(self, fn: Callable[[Any], T], fail: Callable[[int], T]) -> T:
        if self._client is None:
            return fail(NOT_READY)
        try:
            return fn(self._client)
        except (MooncakeError, ValueError, TypeError, OverflowError) as e:
            log.debug("store call failed: %s", e)
            return fail(_code(e))

    @staticmethod
    def _each(items: Sequence[Any]) -> list[int]:
        return [int(i.code) if isinstance(i, StoreError) else 0 for i in items]

    # -- objects ---------------------------------------------------------------------------------
    def put(self, key: str, value: Any, config: Any = None) -> int:
        return self._run(lambda c: c.put(key, value, _native(config)) or 0, int)

    def put_batch(self, keys: list[str], values: list[Any], config: Any = None) -> int:
        codes = self._run(lambda c: self._each(c.batch_put(keys, values, _native(config))),
                          lambda e: [e])
        return next((e for e in codes if e), 0)

    def get(self, key: str) -> bytes:
        return self._run(lambda c: bytes(c.get(key)), lambda e: b"")

    def get_batch(self, keys: list[str]) -> list[bytes]:
        return self._run(lambda c: [v if isinstance(v, bytes) else b"" for v in c.batch_get(keys)],
                         lambda e: [b""] * len(keys))

    def is_exist(self, key: str) -> int:
        return self._run(lambda c: int(c.exists(key)), lambda e: -1)

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        return self._run(lambda c: [-1 if isinstance(v, StoreError) else int(v)
                                    for v in c.batch_exists(keys)],
                         lambda e: [-1] * len(keys))

    def get_size(self, key: str) -> int:
        return self._run(lambda c: int(c.size(key)), int)

    def remove(self, key: str, force: bool = False) -> int:
        return self._run(lambda c: c.remove(key, force) or 0, int)

    def remove_all(self, force: bool = False) -> int:
        return self._run(lambda c: int(c.remove_all(force)), int)

    # -- zero copy -------------------------------------------------------------------------------
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Register `size` bytes at `buffer_ptr` with the engine; kept until unregistered."""
        if self._engine is None:
            return NOT_READY
        if buffer_ptr in self._buffers:
            return BAD
        try:
            view = _view(buffer_ptr, size)
            self._buffers[buffer_ptr] = (self._engine.register(view), view)
        except (MooncakeError, ValueError) as e:
            return _code(e)
        return 0

    def unregister_buffer(self, buffer_ptr: int) -> int:
        entry = self._buffers.pop(buffer_ptr, None)
        if entry is None or self._engine is None:
            return BAD
        self._engine.unregister(entry[0])
        return 0

    def put_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int:
        return self._run(lambda c: c.put(key, _view(buffer_ptr, size), _native(config)) or 0, int)

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read into the buffer, or a negative code (-10 when it is too small)."""
        return self._run(lambda c: int(c.get_into(key, _view(buffer_ptr, size))), int)

    def batch_put_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                       config: Any = None) -> list[int]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [BAD] * len(keys)
        return self._run(
            lambda c: self._each(c.batch_put(keys, [_view(p, n) for p, n in
                                                    zip(buffer_ptrs, sizes, strict=True)],
                                             _native(config))),
            lambda e: [e] * len(keys))

    def batch_get_into(self, keys: list[str], buffer_ptrs: list[int],
                       sizes: list[int]) -> list[int]:
        """Bytes read per key, or its negative code."""
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [BAD] * len(keys)
        return [self.get_into(k, p, n) for k, p, n in zip(keys, buffer_ptrs, sizes, strict=True)]
