#!/usr/bin/env python3
"""The kernel copy under nixl on one host without RDMA: bare `process_vm_writev`/`readv` (what
UCX's cma transport calls) between two processes, through ctypes, beside numpy memcpy, on 4 KiB
pages (shared memory, as a memfd) and on transparent huge pages (private memory).

    python scripts/cma_probe.py                 # 1, 16, 64 MiB; 0.7 s per figure
    python scripts/cma_probe.py --duration 2 --json

"fixed" moves the same block every time (it stays in cache, as in `bench transfer`); "cycled"
walks the 256 MiB buffer, a different block each time (from memory). GB/s = 1e9 bytes/s.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import time

import numpy as np

SPAN = 256 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.process_vm_writev.restype = libc.process_vm_readv.restype = ctypes.c_ssize_t


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def buffer(huge: bool) -> tuple[mmap.mmap, np.ndarray]:
    if huge:
        mm = mmap.mmap(-1, SPAN, flags=mmap.MAP_PRIVATE)
        mm.madvise(mmap.MADV_HUGEPAGE)
    else:
        fd = os.memfd_create("cma-probe")
        os.ftruncate(fd, SPAN)
        mm = mmap.mmap(fd, SPAN)
        os.close(fd)
    arr = np.frombuffer(mm, dtype=np.uint8)
    arr[:] = 1  # fault every page in before timing
    return mm, arr


def rate(step, block: int, cycled: bool, duration: float) -> float:
    windows, k, t0 = SPAN // block, 0, time.perf_counter()
    while time.perf_counter() - t0 < duration:
        step((k % windows) * block if cycled else 0, block)
        k += 1
    return k * block / (time.perf_counter() - t0) / 1e9


def probe(huge: bool, sizes: list[int], duration: float) -> list[dict[str, object]]:
    r, w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the peer: a buffer, its address, then wait
        _mm, arr = buffer(huge)
        os.write(w, str(arr.ctypes.data).encode().ljust(32))
        os.read(done_r, 1)
        os._exit(0)
    remote = int(os.read(r, 32))
    _mm, src = buffer(huge)
    dst = np.empty(SPAN, np.uint8)
    dst[:] = 2
    local = src.ctypes.data

    def cma(fn):
        def step(off: int, n: int) -> None:
            a, b = IoVec(local + off, n), IoVec(remote + off, n)
            if fn(pid, ctypes.byref(a), 1, ctypes.byref(b), 1, 0) != n:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return step

    def copy(off: int, n: int) -> None:
        np.copyto(dst[off:off + n], src[off:off + n])

    rows = []
    try:
        for n in sizes:
            row: dict[str, object] = {"pages": "huge" if huge else "4KiB", "block": n}
            for name, step in (("writev", cma(libc.process_vm_writev)),
                               ("readv", cma(libc.process_vm_readv)), ("memcpy", copy)):
                for cycled in (False, True):
                    key = f"{name} {'cycled' if cycled else 'fixed'}"
                    row[key] = round(rate(step, n, cycled, duration), 2)
            rows.append(row)
    finally:
        os.write(done_w, b"x")
        os.waitpid(pid, 0)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=0.7, help="seconds per figure")
    ap.add_argument("--json", action="store_true", help="one JSON list instead of lines")
    args = ap.parse_args()
    sizes = [1 << 20, 16 << 20, 64 << 20]
    rows = probe(False, sizes, args.duration) + probe(True, sizes, args.duration)
    if args.json:
        print(json.dumps(rows))
        return
    for row in rows:
        rest = "  ".join(f"{k} {v}" for k, v in row.items() if k not in ("pages", "block"))
        print(f"{row['pages']:>4} pages {int(str(row['block'])) >> 20:>2} MiB  {rest}")


if __name__ == "__main__":
    main()
