"""`shm` transport: same-host peers map each other's registered memory through POSIX shared
memory and copy directly, with no socket on the data path.

A peer's shm-backed regions (those allocated from a tier with `shared=True`) are mapped on
first use; requests are bounds-checked against the peer's descriptor before any copy, and each
request checks that the peer process is still alive. When the peer requires a secret the
channel proves it once over the peer's listener before mapping anything. Requests that fall in
a region that is not shm-backed go over a TCP connection instead.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Mapping
from typing import Any

from mooncake_cli.interfaces import EngineSide, RegionInfo, SegmentDescriptor, TransferError
from mooncake_cli.transfer.client import TargetClient

SHM_DIR = "/dev/shm"
ALIVE_EVERY = 0.005  # seconds between checks that the peer process lives


class ShmChannel:
    def __init__(self, peer: SegmentDescriptor, secret: str | None, timeout: float) -> None:
        self.peer = peer
        self.broken = False  # a mapping never breaks; the TCP fallback has its own flag
        self.spin = True
        self._secret, self._timeout = secret, timeout
        self._maps: dict[str, memoryview] = {}
        self._fds: dict[str, int] = {}  # open files of mapped regions: st_nlink 0 = unregistered
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
        """The peer unlinks a region's file when it unregisters it: our mapping would outlive
        it and writes would land in memory nobody reads."""
        if os.fstat(self._fds[r.shm or ""]).st_nlink == 0:
            self._maps.pop(r.shm or "", None)
            os.close(self._fds.pop(r.shm or ""))
            raise TransferError(f"{self.peer.name}: region at offset {r.base} is no longer "
                                "registered")

    def _mapped(self, r: RegionInfo) -> memoryview:
        assert r.shm is not None
        mv = self._maps.get(r.shm)
        if mv is None:
            try:
                fd = os.open(os.path.join(SHM_DIR, r.shm), os.O_RDWR)
            except OSError as e:
                raise TransferError(f"cannot map {r.shm} of '{self.peer.name}': {e}") from e
            try:
                mm = mmap.mmap(fd, 0)
            except OSError:
                os.close(fd)
                raise
            if len(mm) < r.length:
                mm.close()
                os.close(fd)
                raise TransferError(f"{r.shm} is smaller than the peer says ({r.length} bytes)")
            old = self._fds.pop(r.shm, None)
            if old is not None:
                os.close(old)
            self._fds[r.shm] = fd
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
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
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
        if not os.path.isdir(SHM_DIR) or not os.access(SHM_DIR, os.W_OK):
            return False, f"{SHM_DIR} is missing or not writable"
        return True, ""

    def reachable(self, peer: SegmentDescriptor, local: SegmentDescriptor) -> tuple[bool, str]:
        if peer.boot_id != local.boot_id or not peer.boot_id:
            return False, "another host"
        if not any(r.shm and os.path.exists(os.path.join(SHM_DIR, r.shm))
                   for r in peer.regions):
            return False, "same host, but no shm-backed region"
        return True, "same host, shm-backed regions"

    def attach(self, engine: EngineSide) -> ShmEndpoint:
        return ShmEndpoint()


class ShmEndpoint:
    """Publishes the shared-memory name of each shm-backed region (tiers allocate them)."""

    def register(self, region: Any) -> Mapping[str, str]:
        name = getattr(region, "shm", None)
        return {"shm": name} if name else {}

    def unregister(self, region: Any) -> None:
        pass

    def fields(self) -> Mapping[str, str]:
        return {}

    def connect(self, peer: SegmentDescriptor, secret: str | None, timeout: float) -> ShmChannel:
        return ShmChannel(peer, secret, timeout)

    def close(self) -> None:
        pass
