#!/usr/bin/env python3
"""Instructions one 16 x 4 KiB batch put costs the store master and the store client, counted
with valgrind's callgrind (deterministic where timings on a shared VM drift by +-30%).

    python3 scripts/count_store_put.py                    # this checkout
    python3 scripts/count_store_put.py --tree /tmp/old    # a worktree of another commit

Each side runs twice, N1 and N2 batches, and the difference over N2 - N1 is reported, so the
interpreter's start-up and the imports cancel out. `master`: the master's own work in process
(batch put start, batch put end, and an eighth of a holdings poll: the owner's heartbeat).
`client`: our client process, putting into its own segment, its master in a child process
(not counted). Needs valgrind (apt-get install valgrind).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

KEYS = 16

MASTER = f"""
import sys
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.records import Segment
m = StoreMaster()
m.mount_segment(Segment("seg-a", "client-a", "127.0.0.1", 1 << 20, 1 << 32))
rep = m.poll_holdings("client-a", "", 0)
sums = ["%016x" % i for i in range({KEYS})]
for i in range(int(sys.argv[1])):
    keys = [f"k-{{i}}-{{j}}" for j in range({KEYS})]
    m.batch_put_start(keys, [4096] * {KEYS})
    m.batch_put_end(keys, sums)
    if i % 8 == 0:
        rep = m.poll_holdings("client-a", rep.epoch, rep.upto)
"""

CLIENT = f"""
import json, subprocess, sys
from mooncake_cli.config import TransferConfig
from mooncake_cli.heap import tune_heap
from mooncake_cli.registry import Registry
from mooncake_cli.store.client.store_client import StoreClient
from mooncake_cli.transfer.engine import TransferEngine
p = subprocess.Popen([sys.executable, "-m", "mooncake_cli.store.service", "--port", "0"],
                     stdout=subprocess.PIPE, text=True)
addr = json.loads(p.stdout.readline())["address"]
tune_heap()
eng = TransferEngine(TransferConfig(), Registry.from_env())
c = StoreClient(addr, eng, 256 << 20)
vals = [bytes([i]) * 4096 for i in range({KEYS})]
for i in range(int(sys.argv[1])):
    c.batch_put([f"k-{{i}}-{{j}}" for j in range({KEYS})], vals)
c.close(); eng.close(); p.terminate(); p.wait()
"""


def count(script: Path, n: int, env: dict[str, str], cwd: str) -> int:
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                          sys.executable, str(script), str(n)], capture_output=True, text=True,
                         env=env, cwd=cwd, check=True).stderr
    m = re.search(r"Collected\s*:\s*(\d+)", out)
    if m is None:
        raise SystemExit(f"no instruction count from valgrind:\n{out[-2000:]}")
    return int(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]),
                    help="the checkout to measure (put first on PYTHONPATH)")
    ap.add_argument("--n", default="100,400", help="the two run lengths, in batches")
    ap.add_argument("--side", choices=("master", "client", "both"), default="both")
    args = ap.parse_args()
    n1, n2 = (int(x) for x in args.n.split(","))
    env = dict(os.environ, PYTHONPATH=args.tree, PYTHONHASHSEED="0")
    env = {k: v for k, v in env.items() if not k.startswith("MOONCAKE_")}
    with tempfile.TemporaryDirectory() as tmp:  # not the checkout: `-m` would import from cwd
        for side, src in (("master", MASTER), ("client", CLIENT)):
            if args.side not in (side, "both"):
                continue
            script = Path(tmp) / f"{side}.py"
            script.write_text(src)
            a, b = count(script, n1, env, tmp), count(script, n2, env, tmp)
            print(f"{side}: {(b - a) / (n2 - n1):,.0f} instructions per {KEYS} x 4 KiB batch put "
                  f"({args.tree})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
