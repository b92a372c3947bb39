"""`shm` transport: same-host peers map each other's registered memory and copy directly,
with no socket on the data path.

A peer's shm-backed regions (memfds from a tier with `shared=True`: no file anyone could open
by name) are mapped on first use from descriptors the peer hands over its lane (lane.py), to
callers that proved its secret; requests are bounds-checked against the peer's descriptor
before any copy, each checks the region's alive page and, every ALIVE_EVERY seconds, that the
peer process lives. A same-host peer's private host memory (registered buffers that are not
memfds) is copied in and out by the kernel (cma.py: process_vm_writev/readv, behind the same
lane, an alive page per region and a pidfd). Requests the kernel does not allow that way, and
writes that carry a capability, go over a link to the peer's listener instead
(`EngineSide.link`), which also proves the secret before any memory is touched.
"""

from __future__ import annotations

import logging
import mmap
import os
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any

from mooncake_backends.shm.cma import Cma, CmaRefused, address
from mooncake_backends.shm.lane import FdLane, Shared, fetch, guard_process

from mooncake_cli.transfer.spi import (
    EngineSide,
    Link,
    RegionInfo,
    SegmentDescriptor,
    TransferError,
    stream_copy,
)

log = logging.getLogger("mooncake.transfer.shm")
ALIVE_EVERY = 0.005  # seconds between checks that the peer process lives


class ShmChannel:
    def __init__(self, peer: SegmentDescriptor, secret: str | None, timeout: float,
                 engine: EngineSide) -> None:
        self.peer, self._engine = peer, engine
        self.broken = False  # a mapping never breaks; the TCP fallback has its own flag
        self.spin = True
        self._secret, self._timeout = secret, timeout
        self._maps: dict[str, memoryview] = {}
        self._pages: dict[str, mmap.mmap] = {}  # each mapped region's alive page
        self._checked = 0.0  # when the peer process was last seen alive
        self._mms: list[mmap.mmap] = []
        self._tcp: Link | None = None  # the fallback: a link to the peer's listener
        self._cma: Cma | None = None
        self._cma_refused = ""  # why the kernel refused a cross-memory copy (then: tcp)
        if peer.auth:  # prove the secret before touching the peer's memory
            self._tcp = engine.link(peer, timeout)

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

    def _current(self, key: str, base: int) -> None:
        """The peer clears a region's alive page when it unregisters it: our mapping would
        outlive it and writes would land in memory nobody reads (or, for private memory,
        memory the peer may have freed)."""
        if self._pages[key][0] != 1:
            self._maps.pop(key, None)
            self._pages.pop(key).close()
            raise TransferError(f"{self.peer.name}: region at offset {base} is no longer "
                                "registered")

    def _alive_page(self, key: str) -> None:
        """Fetch and map the alive page of the peer's private region `key` (once)."""
        if key in self._pages:
            return
        fd, alive_fd = fetch(self._lane(), key, self._secret, self._timeout)
        try:
            self._pages[key] = mmap.mmap(alive_fd, mmap.PAGESIZE)
        except OSError as e:
            raise TransferError(f"cannot map the alive page of '{self.peer.name}': {e}") from e
        finally:
            os.close(fd)
            os.close(alive_fd)

    def _lane(self) -> str:
        lane = self.peer.extra.get("shm.lane", "")
        if not lane:
            raise TransferError(f"'{self.peer.name}' publishes no shm lane")
        return lane

    def _mapped(self, r: RegionInfo) -> memoryview:
        assert r.shm is not None
        mv = self._maps.get(r.shm)
        if mv is None:
            fd, alive_fd = fetch(self._lane(), r.shm, self._secret, self._timeout)
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

    def _region(self, off: int, n: int) -> RegionInfo:
        r = self.peer.region_for(off, n)
        if r is None:  # the peer may have registered memory since: ask it for a fresh descriptor
            self.peer = SegmentDescriptor.from_json(self._fallback().describe())
            r = self.peer.region_for(off, n)
        if r is None:
            raise TransferError(f"{self.peer.name}: out of bounds: [{off}, {off + n}) is not "
                                "inside one registered region")
        return r

    def _locate(self, off: int, n: int) -> tuple[memoryview | None, int]:
        r = self._region(off, n)
        if r.shm is None:
            return None, 0
        mv = self._mapped(r)
        self._current(r.shm, r.base)
        return mv, off - r.base

    def _private(self, off: int, n: int) -> int | None:
        """The peer's virtual address of [off, off+n) when it is private memory that the kernel
        lets us copy (checked current), else None (then: tcp)."""
        r = self._region(off, n)
        key, va = r.extra.get("shm.cma"), r.extra.get("shm.va")
        if self._cma_refused or not key or not va:
            return None
        self._alive_page(key)
        if self._pages[key][0] != 1:  # unregistered or guarded since: what is it now?
            self._pages.pop(key).close()
            self.peer = SegmentDescriptor.from_json(self._fallback().describe())
            r = self._region(off, n)
            key, va = r.extra.get("shm.cma"), r.extra.get("shm.va")
            if not key or not va:
                return None
            self._alive_page(key)
            self._current(key, r.base)
        if self._cma is None:
            self._cma = Cma(self.peer.pid, self.peer.name)
        return int(va) + off - r.base

    def _kernel_copy(self, write: bool, remote_offset: int, local: memoryview) -> bool:
        """Copy by cma when the region is private and allowed; False to use tcp instead."""
        va = self._private(remote_offset, len(local))
        if va is None:
            return False
        assert self._cma is not None
        try:
            (self._cma.write if write else self._cma.read)(va, local)
        except CmaRefused as e:
            self._cma_refused = str(e)
            log.info("%s: %s: using tcp for its private memory", self.peer.name, e)
            return False
        return True

    def _fallback(self) -> Link:
        if self._tcp is None or self._tcp.broken:
            self._tcp = self._engine.link(self.peer, self._timeout)
        return self._tcp

    def read(self, remote_offset: int, dst: memoryview) -> None:
        self._alive()
        mv, start = self._locate(remote_offset, len(dst))
        if mv is None:
            if not self._kernel_copy(False, remote_offset, dst):
                self._fallback().read(remote_offset, dst)
            return
        stream_copy(dst, mv[start:start + len(dst)])  # without the GIL from 64 KiB

    def view(self, remote_offset: int, n: int) -> memoryview | None:
        """The peer's `n` bytes at `remote_offset` as mapped here (None: not shm-backed)."""
        self._alive()
        mv, start = self._locate(remote_offset, n)
        return None if mv is None else mv[start:start + n]

    def write(self, remote_offset: int, src: memoryview, cap: bytes | None = None) -> None:
        self._alive()
        mv, start = self._locate(remote_offset, len(src))
        if cap is not None:  # a capability is checked by the peer's listener
            return self._fallback().write(remote_offset, src, cap)
        if mv is None:
            if not self._kernel_copy(True, remote_offset, src):
                self._fallback().write(remote_offset, src, cap)
            return
        stream_copy(mv[start:start + len(src)], src)

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
        if self._cma is not None:
            self._cma.close()


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
        if not peer.extra.get("shm.lane") or \
                not any(r.shm or r.extra.get("shm.cma") for r in peer.regions):
            return False, "same host, but no shm-backed or private host region"
        if not os.path.exists(f"/proc/{peer.pid}"):
            return False, f"same host, but its process {peer.pid} is gone"
        if not any(r.shm for r in peer.regions):
            return True, "same host, private memory (cross-memory copies)"
        return True, "same host, shm-backed regions"

    def attach(self, engine: EngineSide) -> ShmEndpoint:
        return ShmEndpoint(engine)


class ShmEndpoint:
    """Shares each shm-backed region's memfd over the lane and publishes its name."""

    def __init__(self, engine: EngineSide) -> None:
        self._engine = engine
        self._grants = engine.grants  # guarded regions get no cross-memory copies
        self._shared: dict[str, Shared] = {}
        self._lane = FdLane(self._shared, engine)
        if engine.secret and not guard_process():
            log.warning("cannot make this process non-dumpable: processes of the same user "
                        "may open its shared memory through /proc")

    def register(self, region: Any) -> Mapping[str, str]:
        name = getattr(region, "shm", None)
        fd = getattr(getattr(region, "keep", None), "fd", None)
        if name and fd is not None:
            self._shared[name] = Shared(fd)
            return {"shm": name}
        view = getattr(region, "view", None)
        if view is None:  # device memory: no host address to copy at
            return {}
        if self._grants.guarded(region.base, region.length):
            return {}  # writes into it must show a capability to the tcp listener
        key = f"cma-{uuid.uuid4().hex}"  # private memory: its alive page, by this name
        self._shared[key] = Shared(None)
        return {"shm.cma": key, "shm.va": str(address(view))}

    def withdraw(self, region: Any) -> None:
        """No more cross-memory copies into `region` (guarded since): its alive page is
        cleared, so peers look again and use tcp."""
        key = region.extra.pop("shm.cma", None)
        region.extra.pop("shm.va", None)
        shared = self._shared.pop(key or "", None)
        if shared is not None:
            shared.retire()

    def unregister(self, region: Any) -> None:
        key = getattr(region, "shm", None) or getattr(region, "extra", {}).get("shm.cma")
        shared = self._shared.pop(key or "", None)
        if shared is not None:
            shared.retire()

    def fields(self) -> Mapping[str, str]:
        return {"shm.lane": self._lane.name}

    def connect(self, peer: SegmentDescriptor, secret: str | None, timeout: float) -> ShmChannel:
        return ShmChannel(peer, secret, timeout, self._engine)

    def close(self) -> None:
        self._lane.close()
        for shared in self._shared.values():
            shared.retire()
        self._shared.clear()
