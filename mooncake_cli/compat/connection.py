"""What the parts of the compat store share: the store client once set up and its engine, the
local buffer size (what the bytes API may stage), and how a call becomes upstream's answer.

`run(fn, fail)` is the one way a part reaches the client: `fn(client)`'s result, or
`fail(code)` when the store is not set up (UNAVAILABLE_IN_CURRENT_STATUS) or the call raised
(its code, codes.py): the compat API never raises where upstream's returns a code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from mooncake_cli.compat.codes import NOT_READY, code_of, put_code
from mooncake_cli.compat.fs_tier import FileTier
from mooncake_cli.compat.persisted import PersistedClient
from mooncake_cli.compat.session import SetupArgs, master_reachable, ssd_size, start_engine
from mooncake_cli.compat.types import native
from mooncake_cli.http.auth import env_secret
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.registry import Registry
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import StoreCode, StoreError
from mooncake_cli.transfer.engine import TransferEngine

log = logging.getLogger("mooncake.compat")
T = TypeVar("T")
Client = StoreClient | PersistedClient  # PersistedClient: the master names a root_fs_dir


class Connection:
    """The set-up state of one compat store (none until `setup`, none again after `close`)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout  # seconds per master request
        self.client: Client | None = None
        self.engine: TransferEngine | None = None
        self.own_engine = self.own_client = True  # close() closes them
        self.hostname = ""
        self.buffer = 0  # local_buffer_size: the bytes API stages through this many bytes

    def attach(self, client: StoreClient, local_buffer_size: int) -> None:
        """Use `client` (and its engine), set up elsewhere: close() leaves both."""
        self.client, self.engine = client, client.engine
        self.own_engine = self.own_client = False
        self.buffer, self.hostname = local_buffer_size, client.engine.name

    def setup(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        """upstream's setup (session.py parses its arguments): 0 or an error code."""
        if self.client is not None:
            return NOT_READY
        try:
            a = SetupArgs.parse(args, kwargs)
            if not master_reachable(a.master, min(self.timeout, 2.0)):
                log.error("setup: no master answers at %s", a.master)
                return int(StoreCode.RPC_FAIL)
            if a.engine is not None and not isinstance(a.engine, TransferEngine):
                raise StoreError("setup: engine must be a mooncake_cli TransferEngine",
                                 StoreCode.INVALID_PARAMS)
            self.own_engine = a.engine is None
            self.engine = a.engine or start_engine(a, Registry.from_env(), self.timeout)
            client = StoreClient(a.master, self.engine, a.segment, timeout=self.timeout,
                                 ssd_dir=a.ssd_dir, ssd_size=ssd_size(a),
                                 secret=env_secret() or None)
            self.client = client
            fs_dir = client.root_fs_dir()
            if fs_dir:  # the master's root_fs_dir: objects persisted there too (persisted.py)
                self.client = PersistedClient(client, FileTier(fs_dir))
        except (MooncakeError, OSError, ValueError) as e:  # a code, as upstream: never raises
            log.error("setup: %s", e)
            self.close()
            return code_of(e)
        self.buffer = a.buffer
        self.hostname = self.engine.name
        return 0

    def close(self) -> None:
        client, engine, self.client, self.engine = self.client, self.engine, None, None
        if client is not None and self.own_client:
            client.close()
        if engine is not None and self.own_engine:
            engine.close()

    def run(self, fn: Callable[[Client], T], fail: Callable[[int], T]) -> T:
        """`fn(client)`, or `fail(code)` when not set up or when it raised."""
        if self.client is None:
            return fail(NOT_READY)
        try:
            return fn(self.client)
        except (MooncakeError, ValueError, TypeError, OverflowError) as e:
            log.debug("store call failed: %s", e)
            return fail(code_of(e))

    def fits(self, sizes: Sequence[int]) -> None:
        """The bytes API stages through local_buffer_size bytes, as upstream."""
        if sum(sizes) > self.buffer:
            raise StoreError(f"{sum(sizes)} bytes do not fit the local buffer of "
                             f"{self.buffer}", StoreCode.INVALID_PARAMS)

    @staticmethod
    def put_one(c: Client, key: str, value: Any, config: Any, upsert: bool) -> int:
        """One put by client `c`: its code (an existing key is 0, as upstream)."""
        try:
            c.put(key, value, native(config), upsert)
        except StoreError as e:
            return put_code(e)
        return 0
