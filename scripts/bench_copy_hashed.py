"""The store's verified copy out of shared memory (`values.copy_hashed`, what a read of a
same-host replica runs) against a plain copy and a hash alone, for several BLOCK sizes, on 1, 2
and 4 threads; 16 values of 8 MiB from a memfd mapping, medians in ms.

    python3 scripts/bench_copy_hashed.py [--blocks 256KiB,1MiB] [--rounds 15]
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import xxhash

from mooncake_cli.config import parse_size
from mooncake_cli.store.client import values

N, K = 8 << 20, 16


def _median_ms(pool: ThreadPoolExecutor, job: Callable[[int], object], rounds: int) -> float:
    took = []
    for _ in range(rounds):
        began = time.perf_counter()
        list(pool.map(job, range(K)))
        took.append(time.perf_counter() - began)
    return statistics.median(took) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", default="256KiB,1MiB", help="BLOCK sizes to compare")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    fd = os.memfd_create("bench-copy-hashed")
    os.ftruncate(fd, N * K)
    os.pwrite(fd, np.random.default_rng(7).integers(0, 255, N * K, np.uint8).tobytes(), 0)
    src = memoryview(mmap.mmap(fd, N * K))
    dest_array = np.ones(N * K, np.uint8)
    dest = dest_array.data

    def plain(i: int) -> object:
        return values.copy_checked(dest[i * N:(i + 1) * N], src[i * N:(i + 1) * N], None)

    def hashed(i: int) -> object:
        return values.copy_hashed(dest[i * N:(i + 1) * N], src[i * N:(i + 1) * N])

    def hash_only(i: int) -> object:
        return xxhash.xxh3_64_intdigest(src[i * N:(i + 1) * N])

    blocks = [parse_size(b) for b in args.blocks.split(",")]
    print(f"{'threads':>7} {'plain copy':>10} {'hash alone':>10} " +
          " ".join(f"{'verified ' + str(b >> 10) + 'K':>14}" for b in blocks))
    for threads in (1, 2, 4):
        with ThreadPoolExecutor(threads) as pool:
            row = [_median_ms(pool, plain, args.rounds), _median_ms(pool, hash_only, args.rounds)]
            for block in blocks:
                values.BLOCK = block
                row.append(_median_ms(pool, hashed, args.rounds))
        print(f"{threads:>7} {row[0]:>10.1f} {row[1]:>10.1f} " +
              " ".join(f"{v:>14.1f}" for v in row[2:]))


if __name__ == "__main__":
    main()
