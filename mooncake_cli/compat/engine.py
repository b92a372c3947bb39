"""Upstream's `mooncake.engine` API over this project's transfer engine: code written for it
(vLLM's MooncakeConnector among them) runs as is.

    from mooncake_cli.compat.engine import TransferEngine
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    te.batch_register_memory([arr.ctypes.data], [arr.nbytes])
    te.batch_transfer_sync_write(f"{peer_host}:{peer_rpc_port}", [src], [dst], [n])  # 0

(`import mooncake.engine` gives this module where upstream's wheel is not installed: the
`mooncake-compat` plugin.) As upstream, memory is addressed by raw virtual addresses: the
engine's segment is `addressed` (each registered region sits at its own address), so a peer's
address is an offset into its segment as it stands, checked against its registered regions by
the peer before any byte moves. Calls return 0 (or a batch id, an address) on success and
upstream's negative codes on failure; unlike upstream's, none crashes the process: a call before
`initialize`, an address outside registered memory (local or remote), an unknown peer or a
length past a region's end is a code, and nothing is read or written.

Protocols: `tcp`; `rdma` uses nixl (UCX) where nixl finds an RDMA device, otherwise every
transport available, as upstream falls back to TCP without a NIC; anything else (`auto`, `shm`,
"") every available transport, the best per peer (shm for a same-host peer's shared regions).
"""

from __future__ import annotations

import enum
import itertools
import json
import logging
import weakref
from collections.abc import Sequence
from typing import Any

from mooncake_cli.compat import ranges
from mooncake_cli.compat.engine_args import checked
from mooncake_cli.compat.engine_setup import EngineArgs, start
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Batch, Op, State, TransferRequest
from mooncake_cli.transfer.engine import TransferEngine as Engine
from mooncake_cli.transfer.segment import Overlap, Region

__all__ = ["TransferEngine", "TransferOpcode", "TransferNotify", "Read", "Write"]
log = logging.getLogger("mooncake.compat")

# upstream's error codes (transfer engine, error.h)
INVALID, NOT_REGISTERED, OVERLAPPED = -1, -3, -7
Ptrs = Sequence[int]


class TransferOpcode(enum.IntEnum):
    Read = 0
    Write = 1


Read, Write = TransferOpcode.Read, TransferOpcode.Write


class TransferNotify:
    """upstream's notification record (name, msg); notifications are not carried here."""

    def __init__(self, name: str = "", msg: str = "") -> None:
        self.name, self.msg = name, msg


class TransferEngine:
    """upstream 0.3.13's TransferEngine: raw addresses, batches, integer codes."""

    def __init__(self) -> None:
        self._engine: Engine | None = None
        self._regions: dict[int, Region] = {}  # registered address -> region
        self._managed: set[int] = set()  # addresses of allocate_managed_buffer's regions
        self._batches: dict[int, Batch] = {}
        self._ids = itertools.count(1)
        self._finalizer: weakref.finalize | None = None

    # -- setup ---------------------------------------------------------------------------------
    @checked("str", "str", "str", "str")
    def initialize(self, local_hostname: str, metadata_server: str, protocol: str,
                   device_name: str) -> int:
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "")

    @checked("str", "str", "str", "str", "str")
    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str,
                       device_name: str, metadata_type: str) -> int:
        """0, or -1 (logged) for bad arguments or an engine that cannot start."""
        if self._engine is not None:
            log.error("initialize: this engine is already initialized")
            return INVALID
        try:
            args = EngineArgs.parse(local_hostname, metadata_server, protocol, device_name,
                                    metadata_type)
            self._engine = start(args, Registry.from_env())
        except (MooncakeError, OSError, ValueError, TypeError) as e:
            log.error("initialize: %s", e)
            return INVALID
        self._finalizer = weakref.finalize(self, self._engine.close)
        return 0

    def close(self) -> None:
        """Stop serving and free managed buffers (not upstream's: its engine lives until the
        object does; ours also closes when collected)."""
        if self._finalizer is not None:
            self._finalizer()
        self._engine = None
        self._regions.clear()
        self._managed.clear()
        self._batches.clear()

    def get_rpc_port(self) -> int:
        """The port peers reach this engine on (its segment is HOST:this port with
        P2PHANDSHAKE); -1 before initialize."""
        return -1 if self._engine is None else int(self._engine.address.rpartition(":")[2])

    def get_engine(self) -> Engine | None:
        """This project's engine underneath (what MooncakeDistributedStore.setup's `engine`
        takes); upstream returns its C++ engine here."""
        return self._engine

    @checked("str?")
    def get_local_topology(self, device_name: str | None = None) -> str:
        """upstream's topology JSON: host memory only, no RDMA NIC matched to it."""
        return json.dumps({"cpu:0": [[], []]}, indent="\t")

    def get_notifies(self) -> list[TransferNotify]:
        return []

    # -- memory --------------------------------------------------------------------------------
    @checked("u64", "u64", "str")
    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        return self.batch_register_memory([buffer_addr], [capacity], location)

    @checked("[u64]", "[u64]", "str")
    def batch_register_memory(self, buffer_addresses: Ptrs, capacities: Sequence[int],
                              location: str = "*") -> int:
        """0; -1 for bad arguments, -7 when a buffer overlaps one registered (the ones
        before it in the list stay registered, as upstream's)."""
        if self._engine is None or len(buffer_addresses) != len(capacities):
            return INVALID
        if location not in ("*", "") and not location.startswith("cpu"):
            log.error("register_memory: %s memory by address is not supported here "
                      "(register the tensor with mooncake_cli's engine)", location)
            return INVALID
        for addr, n in zip(buffer_addresses, capacities, strict=True):
            try:
                region = self._engine.register(ranges.view(addr, n))
            except MooncakeError as e:
                log.error("register_memory: %s", e)
                return OVERLAPPED if isinstance(e.__cause__, Overlap) else INVALID
            self._regions[addr] = region
        return 0

    @checked("u64")
    def unregister_memory(self, buffer_addr: int) -> int:
        return self.batch_unregister_memory([buffer_addr])

    @checked("[u64]")
    def batch_unregister_memory(self, buffer_addresses: Ptrs) -> int:
        """0; -3 for an address that is not the start of a registered buffer (the others
        are unregistered all the same)."""
        if self._engine is None:
            return INVALID
        code = 0
        for addr in buffer_addresses:
            region = self._regions.pop(addr, None) if addr not in self._managed else None
            if region is None:
                code = NOT_REGISTERED
                continue
            self._engine.unregister(region)
        return code

    @checked("u64")
    def allocate_managed_buffer(self, length: int) -> int:
        """The address of `length` fresh registered bytes (shared memory, so a same-host peer
        maps them), or 0."""
        if self._engine is None or not 0 < length < 1 << 48:
            return 0
        try:
            region = self._engine.allocate(length)
        except (MooncakeError, OSError) as e:
            log.error("allocate_managed_buffer: %s", e)
            return 0
        self._regions[region.base] = region
        self._managed.add(region.base)
        return region.base

    @checked("u64", "u64")
    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        if self._engine is None or buffer_addr not in self._managed:
            return INVALID
        self._managed.discard(buffer_addr)
        self._engine.unregister(self._regions.pop(buffer_addr))
        return 0

    def _local(self, addr: int, length: int) -> tuple[Region, int] | None:
        """The registered region holding [addr, addr+length), and the offset in it."""
        if self._engine is None:
            return None
        try:
            return self._engine.segment.locate(addr, length)
        except MooncakeError:
            return None

    @checked("u64", "bytes", "u64")
    def write_bytes_to_buffer(self, dest_address: int, src: bytes, length: int) -> int:
        """Copy `length` bytes of `src` into registered memory at `dest_address`; -1 when it
        is not registered memory or `src` is shorter."""
        found = self._local(dest_address, length)
        src = src.encode() if isinstance(src, str) else src
        if found is None or len(src) < length:
            return INVALID
        region, start = found
        view = region.sink(start, length)
        view[:] = memoryview(src)[:length]
        region.commit(start, view)
        return 0

    @checked("u64", "u64")
    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        """`length` bytes of registered memory at `source_address`; b"" when they are not."""
        found = self._local(source_address, length)
        return b"" if found is None else bytes(found[0].load(found[1], length))

    @checked("str")
    def get_first_buffer_address(self, segment_name: str) -> int:
        """The address of the first buffer segment `segment_name` registered; 0 if none."""
        if self._engine is None:
            return 0
        try:
            desc = self._engine.metadata.lookup(segment_name) \
                if segment_name != self._engine.name else self._engine.descriptor()
        except MooncakeError as e:
            log.error("get_first_buffer_address: %s", e)
            return 0
        return min((r.base for r in desc.regions), default=0)

    @checked("str")
    def send_probe(self, peer_server_name: str) -> int:
        """0 when the peer answers (and its descriptor is read), else -1."""
        if self._engine is None:
            return INVALID
        try:
            self._engine.transport_for(peer_server_name)
        except MooncakeError as e:
            log.error("send_probe %s: %s", peer_server_name, e)
            return INVALID
        return 0

    # -- transfers -----------------------------------------------------------------------------
    def _submit(self, target: str, buffers: Ptrs, peers: Ptrs, lengths: Sequence[int],
                op: Op, notify: Any = None) -> Batch | None:
        if self._engine is None or notify is not None or not isinstance(target, str):
            if notify is not None:
                log.error("transfer: notifications are not supported by this engine")
            return None
        if not len(buffers) == len(peers) == len(lengths):
            log.error("transfer: buffers, peer_buffer_addresses and lengths have different "
                      "sizes")
            return None
        requests = []
        for buf, peer, n in zip(buffers, peers, lengths, strict=True):
            found = self._local(buf, n)
            if found is None:
                log.error("transfer: [%#x, +%d) is not inside one registered buffer of this "
                          "engine", buf, n)
                return None
            requests.append(TransferRequest(op, found[0], found[1], target, peer, n))
        try:
            return self._engine.submit(requests)
        except MooncakeError as e:
            log.error("transfer to %s: %s", target, e)
            return None

    def _wait(self, batch: Batch | None) -> int:
        if batch is None or self._engine is None:
            return INVALID
        statuses = batch.wait(self._engine.config.timeout * 2)
        failed = [s.reason or "timed out" for s in statuses if s.state is not State.COMPLETED]
        if failed:
            log.error("transfer failed: %s", failed[0])
            return INVALID
        return 0

    @checked("str", "u64", "u64", "u64", "opcode", "notify", "str")
    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                      length: int, opcode: TransferOpcode, notify: Any = None,
                      transport_hint: str = "") -> int:
        return self.batch_transfer_sync(target_hostname, [buffer], [peer_buffer_address],
                                        [length], opcode, notify, transport_hint)

    @checked("str", "u64", "u64", "u64", "str")
    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                            length: int, transport_hint: str = "") -> int:
        return self.transfer_sync(target_hostname, buffer, peer_buffer_address, length, Write)

    @checked("str", "u64", "u64", "u64", "str")
    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                           length: int, transport_hint: str = "") -> int:
        return self.transfer_sync(target_hostname, buffer, peer_buffer_address, length, Read)

    @checked("str", "[u64]", "[u64]", "[u64]", "opcode", "notify", "str")
    def batch_transfer_sync(self, target_hostname: str, buffers: Ptrs,
                            peer_buffer_addresses: Ptrs, lengths: Sequence[int],
                            opcode: TransferOpcode, notify: Any = None,
                            transport_hint: str = "") -> int:
        """0 when every buffer moved; -1 (logged) otherwise."""
        return self._wait(self._submit(target_hostname, buffers, peer_buffer_addresses,
                                       lengths, _op(opcode), notify))

    @checked("str", "[u64]", "[u64]", "[u64]", "str")
    def batch_transfer_sync_write(self, target_hostname: str, buffers: Ptrs,
                                  peer_buffer_addresses: Ptrs, lengths: Sequence[int],
                                  transport_hint: str = "") -> int:
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses,
                                        lengths, Write)

    @checked("str", "[u64]", "[u64]", "[u64]", "str")
    def batch_transfer_sync_read(self, target_hostname: str, buffers: Ptrs,
                                 peer_buffer_addresses: Ptrs, lengths: Sequence[int],
                                 transport_hint: str = "") -> int:
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses,
                                        lengths, Read)

    @checked("str", "[u64]", "[u64]", "[u64]", "opcode", "str")
    def batch_transfer_async(self, target_hostname: str, buffers: Ptrs,
                             peer_buffer_addresses: Ptrs, lengths: Sequence[int],
                             opcode: TransferOpcode, transport_hint: str = "") -> int:
        """A batch id for get_batch_transfer_status / transfer_check_status, or 0."""
        batch = self._submit(target_hostname, buffers, peer_buffer_addresses, lengths,
                             _op(opcode))
        if batch is None:
            return 0
        bid = next(self._ids)
        self._batches[bid] = batch
        return bid

    @checked("str", "[u64]", "[u64]", "[u64]", "str")
    def batch_transfer_async_write(self, target_hostname: str, buffers: Ptrs,
                                   peer_buffer_addresses: Ptrs, lengths: Sequence[int],
                                   transport_hint: str = "") -> int:
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses,
                                         lengths, Write)

    @checked("str", "[u64]", "[u64]", "[u64]", "str")
    def batch_transfer_async_read(self, target_hostname: str, buffers: Ptrs,
                                  peer_buffer_addresses: Ptrs, lengths: Sequence[int],
                                  transport_hint: str = "") -> int:
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses,
                                         lengths, Read)

    @checked("str", "u64", "u64", "u64", "str")
    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                              length: int, transport_hint: str = "") -> int:
        return self.batch_transfer_async(target_hostname, [buffer], [peer_buffer_address],
                                         [length], Write)

    @checked("[u64]")
    def get_batch_transfer_status(self, batch_ids: Sequence[int]) -> int:
        """Wait for every batch: 0 when all moved, -1 when one failed or is unknown (each is
        forgotten afterwards)."""
        codes = [self._wait(self._batches.pop(b, None)) for b in batch_ids]
        return INVALID if any(codes) else 0

    @checked("u64")
    def transfer_check_status(self, batch_id: int) -> int:
        """1 completed, 0 still running, -1 failed or unknown (a finished batch is forgotten,
        as upstream frees it)."""
        batch = self._batches.get(batch_id)
        if batch is None:
            return INVALID
        if not batch.done:
            return 0
        del self._batches[batch_id]
        return 1 if all(s.state is State.COMPLETED for s in batch.poll()) else INVALID


def _op(opcode: Any) -> Op:
    return Op.READ if int(opcode) == TransferOpcode.Read else Op.WRITE
