"""`dram` tier: anonymous memory, or POSIX shared memory that same-host peers can map."""

from __future__ import annotations

import mmap
import os
import uuid

SHM_DIR = "/dev/shm"
PREFIX = "mooncake-"
HUGE = 2 << 20


class DramBuffer:
    """A zeroed buffer. When `shm` is set, a same-host peer maps it by that name."""

    def __init__(self, size: int, shared: bool) -> None:
        self.shm: str | None = None
        if shared:
            name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, max(size, 1))
                self._mm = mmap.mmap(fd, max(size, 1))
            finally:
                os.close(fd)
            self.shm = name
        else:
            self._mm = mmap.mmap(-1, max(size, 1))
            if size >= HUGE and hasattr(mmap, "MADV_HUGEPAGE"):
                try:  # transparent huge pages: fewer TLB misses on large copies
                    self._mm.madvise(mmap.MADV_HUGEPAGE)
                except OSError:
                    pass
        self.view = memoryview(self._mm)[:size]

    def close(self) -> None:
        if self.shm is not None:
            try:
                os.unlink(os.path.join(SHM_DIR, self.shm))
            except FileNotFoundError:
                pass
            self.shm = None
        self.view.release()
        try:
            self._mm.close()
        except BufferError:  # a caller still holds a view; the mapping goes with it
            pass


def sweep_stale(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink shared buffers left behind by mooncake processes that no longer exist."""
    removed: list[str] = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(PREFIX):
            continue
        try:
            pid = int(name[len(PREFIX):].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.unlink(os.path.join(shm_dir, name))
                removed.append(name)
            except OSError:
                pass
    return removed


class DramTier:
    name = "dram"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def allocate(self, size: int, shared: bool = True) -> DramBuffer:
        if size < 0:
            raise ValueError(f"buffer size must be >= 0, got {size}")
        if shared and not os.path.isdir(SHM_DIR):
            shared = False
        if shared:
            sweep_stale()
        return DramBuffer(size, shared)
