"""The store's copies of a value into a segment, side by side with glibc's memmove (a plain
memcpy: what upstream's client does) in the same run: `stream_copy` (non-temporal stores,
mooncake_cli/native), the memmove fallback, a hash alone, and `copy_hashed` (the copy a put
runs, with its checksum). Each value is copied out of a 256 MiB source into a 256 MiB memfd
mapping, walking both, so no copy finds its bytes in a cache; medians in µs, and ratios to
memmove (above 1: faster).

    python3 scripts/bench_copy_hashed.py [--sizes 128KiB,1MiB,4MiB,16MiB] [--rounds 41] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import xxhash

from mooncake_cli import native
from mooncake_cli.config import parse_size
from mooncake_cli.store.client import values

SPAN = 256 << 20


def _median_us(job: Callable[[int, int], object], n: int, rounds: int) -> float:
    took = []
    for i in range(rounds):
        at = (i * n) % (SPAN - n)
        began = time.perf_counter()
        job(at, n)
        took.append(time.perf_counter() - began)
    return statistics.median(took) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="128KiB,1MiB,4MiB,16MiB")
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--json", action="store_true", help="one JSON object per size")
    args = ap.parse_args()
    fd = os.memfd_create("bench-copy-hashed")
    os.ftruncate(fd, SPAN)
    dest = memoryview(mmap.mmap(fd, SPAN))
    dest[:] = b"\1" * SPAN  # no page faults in the timed copies
    src_array = np.random.default_rng(7).integers(0, 255, SPAN, np.uint8)
    src = memoryview(src_array)
    d0, s0 = native.address(dest), native.address(src)
    jobs: dict[str, Callable[[int, int], object]] = {
        "memmove": lambda at, n: ctypes.memmove(d0 + at, s0 + at, n),
        "stream_copy": lambda at, n: native.stream_copy(dest[at:at + n], src[at:at + n]),
        "hash alone": lambda at, n: xxhash.xxh3_64_intdigest(src[at:at + n]),
        "memmove, then hash": lambda at, n: (ctypes.memmove(d0 + at, s0 + at, n),
                                             xxhash.xxh3_64_intdigest(dest[at:at + n])),
        "copy_hashed": lambda at, n: values.copy_hashed(dest[at:at + n], src[at:at + n]),
    }
    if not args.json:
        print(f"streamed copy built: {native.STREAMED}")
        print(f"{'size':>8} " + " ".join(f"{name:>20}" for name in jobs))
    for size in (parse_size(s) for s in args.sizes.split(",")):
        got = {name: _median_us(job, size, args.rounds) for name, job in jobs.items()}
        if args.json:
            print(json.dumps({"size": size, "us": got,
                              "vs_memmove": {k: got["memmove"] / v for k, v in got.items()}}))
            continue
        print(f"{size >> 10:>6}Ki " + " ".join(
            f"{us:>11.0f} ({got['memmove'] / us:4.2f}x)" for us in got.values()))


if __name__ == "__main__":
    main()
