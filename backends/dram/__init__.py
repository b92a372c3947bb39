"""`dram` tier: anonymous memory, or shared memory (a memfd: no name anyone could open; the shm
transport hands its descriptor to peers that proved the secret) same-host peers can map, or
explicit huge pages (MAP_HUGETLB) when asked: those need pages reserved by the administrator
(`sysctl vm.nr_hugepages`); without them the tier says how to reserve some and either falls
back to normal pages (with a warning) or, when strict, refuses."""

from __future__ import annotations

import logging
import mmap
import os
import uuid

from mooncake_cli.interfaces import ConfigError

SHM_DIR = "/dev/shm"
PREFIX = "mooncake-"
HUGE = 2 << 20
MAP_HUGETLB = getattr(mmap, "MAP_HUGETLB", 0x40000)  # Linux's value; Python 3.11 does not name it

log = logging.getLogger("mooncake.tiers")


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if rest.split() and rest.split()[0].isdigit():
                    out[name] = int(rest.split()[0])
    except OSError:
        pass
    return out


def hugepage_advice(size: int) -> str:
    """Why `size` bytes of huge pages cannot be had, and how to reserve them."""
    info = _meminfo()
    page = info.get("Hugepagesize", HUGE >> 10) << 10
    need = -(-size // page)
    total, free = info.get("HugePages_Total", 0), info.get("HugePages_Free", 0)
    return (f"{need} huge pages of {page >> 20} MiB are needed for {size} bytes but "
            f"{free} of {total} are free: reserve them with `sudo sysctl -w "
            f"vm.nr_hugepages={total + need}` (or `hugepages={total + need}` on the kernel "
            "command line)")


class DramBuffer:
    """A zeroed buffer. When `shm` is set, `fd` is its memfd, which the shm transport passes
    to same-host peers. With `hugepages`, private memory on explicit huge pages (OSError when
    none can be had)."""

    def __init__(self, size: int, shared: bool, hugepages: bool = False) -> None:
        self.shm: str | None = None
        self.fd: int | None = None
        self.hugepages = hugepages
        if hugepages:
            length = -(-max(size, 1) // HUGE) * HUGE
            self._mm = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | MAP_HUGETLB)
        elif shared:
            name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, max(size, 1))
                self._mm = mmap.mmap(fd, max(size, 1))
            except BaseException:
                os.close(fd)
                raise
            self.fd, self.shm = fd, name
        else:
            # private: a MAP_SHARED anonymous mapping is shmem, which gets no transparent huge
            # pages unless shmem_enabled allows them
            self._mm = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE)
            if size >= HUGE and hasattr(mmap, "MADV_HUGEPAGE"):
                try:  # fewer TLB misses on large copies, and cma pins 2 MiB pages
                    self._mm.madvise(mmap.MADV_HUGEPAGE)
                except OSError:
                    pass
        self.view = memoryview(self._mm)[:size]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = self.shm = None
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

    def allocate(self, size: int, shared: bool = True, hugepages: bool = False,
                 strict: bool = False) -> DramBuffer:
        """A zeroed buffer; `hugepages` asks for explicit huge pages (never shared: same-host
        peers then reach it over TCP). Without reserved huge pages: ConfigError saying how to
        reserve them when `strict`, else a warning and normal pages (`.hugepages` False)."""
        if size < 0:
            raise ValueError(f"buffer size must be >= 0, got {size}")
        if hugepages:
            try:
                return DramBuffer(size, False, hugepages=True)
            except OSError as e:
                advice = f"cannot map huge pages ({e.strerror}): {hugepage_advice(size)}"
                if strict:
                    raise ConfigError(advice) from None
                log.warning("%s; using normal pages", advice)
        if shared and not hasattr(os, "memfd_create"):
            shared = False
        if shared:
            sweep_stale()  # files of older versions, which named their buffers in /dev/shm
        return DramBuffer(size, shared)
