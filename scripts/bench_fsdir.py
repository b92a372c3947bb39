"""Puts and gets through the upstream API with the master's --root_fs_dir: ours (our master,
mooncake_cli.compat.store) and upstream's (its mooncake_master, mooncake.store) in one run.

    python3 scripts/bench_fsdir.py [--size 1MiB] [--keys 200] [--dir /tmp]

Each side: one client with a 64 MiB segment puts KEYS distinct values (more than memory holds,
so the first ones are evicted and only their files remain), waits until every file is written,
then reads the first 16 back 5 times each (from their files). Prints the times and the speed
ratio ours ÷ upstream (upstream's time over ours: above 1, ours is faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("GLOG_minloglevel", "2")
MiB = 1 << 20


def _our_master(root: Path) -> tuple[Any, str]:
    import json

    proc = subprocess.Popen([sys.executable, "-m", "mooncake_cli", "--json", "store", "master",
                             "--port", "0", "--root_fs_dir", str(root)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    return proc, str(ready["address"])


def _files(root: Path) -> int:
    return sum(len(f) for _, _, f in os.walk(root))


def run(side: str, root: Path, size: int, keys: int) -> dict[str, float]:
    root.mkdir()
    if side == "ours":
        from mooncake_cli.compat import store as module

        proc, address = _our_master(root)
        stop = proc.terminate
    else:
        import mooncake.store as module

        from mooncake_cli.bench.store_upstream import UpstreamMaster

        um = UpstreamMaster(f"--root_fs_dir={root}")
        address, stop = um.address, um.close
    try:
        s = module.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 64 * MiB, 2 * size + MiB, "tcp", "",
                       address) == 0
        values = [os.urandom(size) for _ in range(8)]
        puts = []
        t0 = time.perf_counter()
        for i in range(keys):
            t = time.perf_counter()
            while s.put(f"k{i}", values[i % 8]) != 0:  # memory full while evicting: again
                time.sleep(0.001)
            puts.append(time.perf_counter() - t)
        while _files(root) < keys and time.perf_counter() - t0 < 120:
            time.sleep(0.005)
        written = time.perf_counter() - t0
        gets = []
        for _ in range(5):
            for i in range(16):
                t = time.perf_counter()
                got = s.get(f"k{i}")
                gets.append(time.perf_counter() - t)
                assert got == values[i % 8], f"{side}: k{i} read back wrong"
        s.close()
    finally:
        stop()
    return {"put_p50_us": statistics.median(puts) * 1e6,
            "all_written_s": written,
            "get_from_file_p50_us": statistics.median(gets) * 1e6}


def main() -> None:
    from mooncake_cli.config import parse_size

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1MiB")
    ap.add_argument("--keys", type=int, default=200)
    ap.add_argument("--dir", default=None, help="where the roots go [default: a temp dir]")
    a = ap.parse_args()
    size = parse_size(a.size)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        res = {side: run(side, Path(tmp) / side, size, a.keys) for side in ("ours", "upstream")}
    print(f"{a.keys} puts of {a.size} through a 64 MiB segment, root_fs_dir under "
          f"{a.dir or tempfile.gettempdir()}")
    print(f"{'time':<24}{'ours':>12}{'upstream':>12}{'speed, ours ÷ upstream':>26}")
    for name in res["ours"]:
        o, u = res["ours"][name], res["upstream"][name]
        print(f"{name:<24}{o:>12.1f}{u:>12.1f}{u / o:>26.2f}")


if __name__ == "__main__":
    main()
