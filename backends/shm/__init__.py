"""`shm` transport: same-host peers map each other's registered memory and copy directly,
with no socket on the data path.

A peer's shm-backed regions (memfds from a tier with `shared=True`: no file anyone could open
by name) are mapped on first use from descriptors the peer hands over its lane (lane.py), to
callers that proved its secret; requests are bounds-checked against the peer's descriptor
before any copy, each checks the region's alive page and, every ALIVE_EVERY seconds, that the
peer process lives. Requests that fall in a region that is not shm-backed, and writes that
carry a capability, go over a TCP connection instead.
"""

from __future__ import annotations

import logging
import mmap
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from mooncake_backends.shm.lane import FdLane, Shared, fetch, guard_process

from mooncake_cli.interfaces import EngineSide, RegionInfo, SegmentDescriptor, TransferError
from mooncake_cli.transfer.client import TargetClient

log = logging.getLogger("mooncake.transfer.shm")
ALIVE_EVERY = 0.005  # seconds between checks that the peer process lives


class ShmChannel:
    def __init__(self, peer: SegmentDescriptor, secret: str | None, timeout: float) -> None:
        self.peer = peer
        self.broken = False  # a mapping never breaks; the TCP fallback has its own flag
        self.spin = True
        self._secret, self._timeout = secret, timeout
        self._maps: dict[str, memoryview] = {}
        self._pages: dict[str, mmap.mmap] = {}  # each mapped region's alive page
        self._checked = 0.0  # when the peer process was last seen alive
        self._mms: list[mmap.mmap] = []
        self._tcp: TargetClient | None = None
        if peer.auth:  # prove the secret before touching the peer's memory
            self._tcp = TargetClient(peer.host, peer.port, secret, timeout)

    def _alive(self) -> None:
        """Every ALIVE_EVERY seconds: is the peer process still there? (A syscall per request
        costs more than the check is worth; a copy into a just-dead peer's memory is lost
        exactly like one that completed just before it died.)"""
        now = time.monotonic()
        if now - self._checked < ALIVE_EVERY:
            return
        try:
            os.kill(self.peer.pid, 0)
        except ProcessLookupError:
            raise TransferError(f"peer '{self.peer.name}' (pid {self.peer.pid}) is gone") from None
        except PermissionError:
            pass
        self._checked = now

    def _current(self, r: RegionInfo) -> None:
        """The peer clears a region's alive page when it unregisters it: our mapping would
        outlive it and writes would land in memory nobody reads."""
        if self._pages[r.shm or ""][0] != 1:
            self._maps.pop(r.shm or "", None)
            self._pages.pop(r.shm or "").close()
            raise TransferError(f"{self.peer.name}: region at offset {r.base} is no longer "
                                "registered")

    def _mapped(self, r: RegionInfo) -> memoryview:
        assert r.shm is not None
        mv = self._maps.get(r.shm)
        if mv is None:
            lane = self.peer.extra.get("shm.lane", "")
            if not lane:
                raise TransferError(f"'{self.peer.name}' publishes no shm lane")
            fd, alive_fd = fetch(lane, r.shm, self._secret, self._timeout)
            try:
                mm = mmap.mmap(fd, 0)
                alive = mmap.mmap(alive_fd, mmap.PAGESIZE)
            except OSError as e:
                raise TransferError(f"cannot map {r.shm} of '{self.peer.name}': {e}") from e
            finally:
                os.close(fd)
                os.close(alive_fd)
            if len(mm) < r.length:
                mm.close()
                alive.close()
                raise TransferError(f"{r.shm} is smaller than the peer says ({r.length} bytes)")
            old = self._pages.pop(r.shm, None)
            if old is not None:
                old.close()
            self._pages[r.shm] = alive
            self._mms.append(mm)
            mv = self._maps[r.shm] = memoryview(mm)[:r.length]
        return mv

    def _locate(self, off: int, n: int) -> tuple[memoryview | None, int]:
        r = self.peer.region_for(off, n)
        if r is None:  # the peer may have registered memory since: ask it for a fresh descriptor
            self.peer = SegmentDescriptor.from_json(self._fallback().describe())
            r = self.peer.region_for(off, n)
        if r is None:
            raise TransferError(f"{self.peer.name}: out of bounds: [{off}, {off + n}) is not "
                                "inside one registered region")
        if r.shm is None:
            return None, 0
        mv = self._mapped(r)
        self._current(r)
        return mv, off - r.base

    def _fallback(self) -> TargetClient:
        if self._tcp is None or self._tcp.broken:
            self._tcp = TargetClient(self.peer.host, self.peer.port, self._secret, self._timeout)
        return self._tcp

    def read(self, remote_offset: int, dst: memoryview) -> None:
        self._alive()
        mv, start = self._locate(remote_offset, len(dst))
        if mv is None:
            return self._fallback().read(remote_offset, dst)
        dst[:] = mv[start:start + len(dst)]

    def view(self, remote_offset: int, n: int) -> memoryview | None:
        """The peer's `n` bytes at `remote_offset` as mapped here (None: not shm-backed)."""
        self._alive()
        mv, start = self._locate(remote_offset, n)
        return None if mv is None else mv[start:start + n]

    def write(self, remote_offset: int, src: memoryview, cap: bytes | None = None) -> None:
        self._alive()
        mv, start = self._locate(remote_offset, len(src))
        if mv is None or cap is not None:  # a capability is checked by the peer's listener
            return self._fallback().write(remote_offset, src, cap)
        mv[start:start + len(src)] = src

    def close(self) -> None:
        for mv in self._maps.values():
            mv.release()
        self._maps.clear()
        for mm in self._mms:
            try:
                mm.close()
            except BufferError:
                pass
        self._mms.clear()
        for page in self._pages.values():
            page.close()
        self._pages.clear()
        if self._tcp is not None:
            self._tcp.close()


class ShmTransport:
    name = "shm"
    priority = 20
    # A copy holds the GIL and one thread already reaches memcpy speed: run batches in the
    # submitting thread and never cut a request (parallel copies only add hand-offs).
    inline_bytes = 256 << 20
    max_slices = 1

    def why_priority(self) -> str:
        return "auto picks shm for a same-host peer with shm-backed memory"

    def available(self) -> tuple[bool, str]:
        if not hasattr(os, "memfd_create") or not hasattr(socket, "send_fds"):
            return False, "this system has no memfd_create or SCM_RIGHTS"
        return True, ""

    def reachable(self, peer: SegmentDescriptor, local: SegmentDescriptor) -> tuple[bool, str]:
        if peer.boot_id != local.boot_id or not peer.boot_id:
            return False, "another host"
        if not peer.extra.get("shm.lane") or not any(r.shm for r in peer.regions):
            return False, "same host, but no shm-backed region"
        if not os.path.exists(f"/proc/{peer.pid}"):
            return False, f"same host, but its process {peer.pid} is gone"
        return True, "same host, shm-backed regions"

    def attach(self, engine: EngineSide) -> ShmEndpoint:
        return ShmEndpoint(engine.secret)


class ShmEndpoint:
    """Shares each shm-backed region's memfd over the lane and publishes its name."""

    def __init__(self, secret: str | None) -> None:
        self._shared: dict[str, Shared] = {}
        self._lane = FdLane(self._shared, secret)
        if secret and not guard_process():
            log.warning("cannot make this process non-dumpable: processes of the same user "
                        "may open its shared memory through /proc")

    def register(self, region: Any) -> Mapping[str, str]:
        name = getattr(region, "shm", None)
        fd = getattr(getattr(region, "keep", None), "fd", None)
        if not name or fd is None:
            return {}
        self._shared[name] = Shared(fd)
        return {"shm": name}

    def unregister(self, region: Any) -> None:
        shared = self._shared.pop(getattr(region, "shm", None) or "", None)
        if shared is not None:
            shared.retire()

    def fields(self) -> Mapping[str, str]:
        return {"shm.lane": self._lane.name}

    def connect(self, peer: SegmentDescriptor, secret: str | None, timeout: float) -> ShmChannel:
        return ShmChannel(peer, secret, timeout)

    def close(self) -> None:
        self._lane.close()
        for shared in self._shared.values():
            shared.retire()
        self._shared.clear()
