"""A channel to one peer's NIXL agent: each request of a batch becomes one NIXL transfer
(READ or WRITE between registered descriptors) with its own status; the endpoint's poller
completes them. Requests are bounds-checked against the peer's registered regions here too
(the engine already refused any outside them), so NIXL never sees an address of ours to
guess. When the peer requires a secret its agent metadata is fetched only over a link to its
listener (`EngineSide.link`), after the handshake proved the secret."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from mooncake_backends.nixl.endpoint import NixlEndpoint

from mooncake_cli.transfer.spi import SegmentDescriptor, Slice, TransferError

Table = list[tuple[int, int, str, int, int]]  # (base, length, mem, address, device)
SPIN = 0.002  # seconds a batch is polled in the posting thread before the poller takes it
REFRESH = 1.0  # seconds a peer's region table is trusted before it is fetched again


@dataclass(frozen=True)
class Scratch:
    """A caller's buffer registered with NIXL for one transfer (`read`/`write` outside a batch),
    standing in for a region of the engine."""

    base: int
    length: int
    location: str
    view: memoryview


def table_of(desc: SegmentDescriptor) -> Table:
    out = []
    for r in desc.regions:
        field = r.extra.get("nixl")
        if not field:
            continue
        try:
            mem, addr, dev = field.split(":")
            out.append((r.base, r.length, mem, int(addr), int(dev)))
        except ValueError:
            continue  # a malformed field: that region is unreachable over nixl
    return out


class NixlChannel:
    def __init__(self, ep: NixlEndpoint, peer: SegmentDescriptor, secret: str | None,
                 timeout: float) -> None:
        self.ep, self.peer = ep, peer
        self._secret, self._timeout = secret, timeout
        self.broken = False
        self.spin = True
        if peer.auth or "nixl" not in peer.extra:
            self.peer = self._describe()
        self.remote = ep.load_peer(self.peer)
        self._table = table_of(self.peer)
        self._fetched = time.monotonic()

    def _describe(self) -> SegmentDescriptor:
        client = self.ep.engine.link(self.peer, self._timeout)
        try:
            return SegmentDescriptor.from_json(client.describe())
        finally:
            client.close()

    def _refresh(self, reconnect: bool = False) -> None:
        self.peer = self._describe()
        self.remote = self.ep.load_peer(self.peer, reconnect)
        self._table = table_of(self.peer)
        self._fetched = time.monotonic()

    def _find(self, off: int, n: int) -> tuple[str, int, int] | None:
        for base, length, mem, addr, dev in self._table:
            if base <= off and off + n <= base + length:
                return mem, addr + off - base, dev
        return None

    def _remote(self, off: int, n: int) -> tuple[str, int, int]:
        found = self._find(off, n)
        if found is None:  # the peer may have registered memory since we looked
            self._refresh()
            found = self._find(off, n)
        if found is None:
            raise TransferError(f"{self.peer.name}: out of bounds: [{off}, {off + n}) is not "
                                "inside one region registered with nixl")
        return found

    def _start(self, s: Slice) -> Any:
        """Post one transfer; its handle, or None when it already completed."""
        lmem, laddr, ldev = self.ep.local(s.region)
        rmem, raddr, rdev = self._remote(s.remote_offset, s.length)
        agent = self.ep.agent
        try:
            local = agent.get_xfer_descs([(laddr + s.start, s.length, ldev)], lmem)
            remote = agent.get_xfer_descs([(raddr, s.length, rdev)], rmem)
            handle = agent.initialize_xfer("READ" if s.op == "read" else "WRITE", local,
                                           remote, self.remote)
            state = agent.transfer(handle)
        except Exception as e:
            raise TransferError(self._explain(s, f"{type(e).__name__}: {e}")) from e
        if state == "DONE":
            self.ep.release(handle)
            return None
        if state != "PROC":
            self.ep.release(handle)
            raise TransferError(f"{self.peer.name}: nixl refused the transfer ({state})")
        return handle

    def _explain(self, s: Slice, why: str) -> str:
        """Why slice `s` failed, in our words. NIXL drops its connection on any error: ask
        the peer's listener whether it lives (then reconnect, and say if the region is gone)."""
        try:
            self._refresh(reconnect=True)
        except TransferError:
            self.broken = True
            return f"connection to '{self.peer.name}' lost ({why})"
        if self._find(s.remote_offset, s.length) is None:
            return (f"{self.peer.name}: out of bounds: [{s.remote_offset}, "
                    f"{s.remote_offset + s.length}) is no longer registered")
        return f"{self.peer.name}: nixl: {why}"

    def post(self, slices: Sequence[Slice], done: Callable[[int, str | None], None],
             timeout: float) -> None:
        deadline = time.monotonic() + timeout
        if deadline - timeout - self._fetched > REFRESH and not self.broken:
            try:  # one-sided: only a fresh table shows regions the peer has unregistered
                self._refresh()
            except TransferError:
                self.broken = True
        running: list[tuple[int, Slice, Any]] = []
        for k, s in enumerate(slices):
            if s.length == 0:
                done(k, None)
                continue
            if self.broken:
                done(k, f"connection to '{self.peer.name}' is broken")
                continue
            try:
                handle = self._start(s)
            except TransferError as e:
                done(k, str(e))
                continue
            if handle is None:
                done(k, None)
            else:
                running.append((k, s, handle))
        # a short batch completes here, without waking the poller and then the waiter
        spin_until = min(deadline, time.monotonic() + SPIN)
        while running and time.monotonic() < spin_until:
            still = []
            for k, s, handle in running:
                why = self.ep.state(handle)
                if why is None:
                    still.append((k, s, handle))
                else:
                    done(k, self._explain(s, why) if why else None)
            running = still
        for k, s, handle in running:
            self.ep.watch(handle, deadline, lambda why, k=k, s=s: done(
                k, None if why is None else self._explain(s, why)))

    def _one(self, op: str, remote_offset: int, buf: memoryview) -> None:
        """read/write of an unregistered buffer: registered for the one transfer."""
        if not len(buf):
            return
        addr = int(np.frombuffer(buf, dtype=np.uint8).ctypes.data)
        reg = self.ep.agent.register_memory([(addr, len(buf), 0, "")], "DRAM")
        try:
            tmp = Scratch(-1 - addr, len(buf), "cpu:0", buf)
            self.ep._regs[tmp.base] = (reg, ("DRAM", addr, 0))
            finished = threading.Event()
            errors: list[str] = []

            def done(_k: int, why: str | None) -> None:
                if why:
                    errors.append(why)
                finished.set()

            self.post([Slice(op, tmp, 0, len(buf), remote_offset)], done, self._timeout)
            if not finished.wait(self._timeout + 1):
                raise TransferError(f"{self.peer.name}: no answer within {self._timeout:g} s")
            if errors:
                raise TransferError(errors[0])
        finally:
            self.ep._regs.pop(-1 - addr, None)
            self.ep.agent.deregister_memory(reg)

    def read(self, remote_offset: int, dst: memoryview) -> None:
        self._one("read", remote_offset, dst)

    def write(self, remote_offset: int, src: memoryview) -> None:
        if src.readonly:  # NIXL registers writable memory only
            src = memoryview(bytearray(src))
        self._one("write", remote_offset, src)

    def close(self) -> None:
        pass  # the agent (the endpoint's) keeps the peer's metadata for other channels
