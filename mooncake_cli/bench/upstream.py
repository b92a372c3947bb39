"""The same workload through the official upstream wheel (`mooncake-transfer-engine-non-cuda`,
the `upstream` extra), target and initiator each in their own child process so no GIL is
shared with us or with each other:

    python -m mooncake_cli.bench.upstream target BUFFER_SIZE
    python -m mooncake_cli.bench.upstream initiator '{"port": ..., "addr": ..., ...}'

Both speak P2PHANDSHAKE over upstream's tcp transport; the target is "127.0.0.1:<rpc port>".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from mooncake_cli.bench.stats import Child, Progress, Result, await_line, emit, summarize
from mooncake_cli.interfaces import TransferError

WHEEL = "mooncake-transfer-engine-non-cuda"
_QUIET = {"GLOG_minloglevel": "2"}
INSTALL = (f"install it with `pip install 'mooncake-cli[upstream]'` ({WHEEL}; needs Debian's "
           "libibverbs1)")


def available() -> tuple[bool, str]:
    """Whether `from mooncake.engine import TransferEngine` works (checked in a child)."""
    try:
        p = subprocess.run([sys.executable, "-c", "from mooncake.engine import TransferEngine"],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, **_QUIET})
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"cannot check for the upstream wheel: {e}"
    if p.returncode == 0:
        return True, ""
    last = (p.stderr.strip().splitlines() or ["import failed"])[-1]
    return False, f"the upstream wheel does not import ({last}); {INSTALL}"


class UpstreamTarget:
    """Upstream's engine serving a registered buffer in a child process."""

    def __init__(self, buffer_size: int) -> None:
        argv = [sys.executable, "-m", "mooncake_cli.bench.upstream", "target", str(buffer_size)]
        self._child = Child(argv, "the upstream target", _QUIET)
        try:
            info = self._child.line(timeout=60)
        except BaseException:
            self._child.close()
            raise
        self.port, self.addr, self.size = int(info["port"]), int(info["addr"]), buffer_size

    def measure(self, op: str, block: int, batch: int, threads: int, duration: float,
                buffer_size: int, progress: Progress | None = None,
                label: str = "upstream") -> Result:
        job = {"port": self.port, "addr": self.addr, "peer_size": self.size, "op": op,
               "block": block, "batch": batch, "threads": threads, "duration": duration,
               "buffer_size": buffer_size}
        argv = [sys.executable, "-m", "mooncake_cli.bench.upstream", "initiator",
                json.dumps(job)]
        with Child(argv, "the upstream initiator", _QUIET) as child:
            first = child.line(timeout=60)  # connected and warmed up: the clock starts now
            if "error" in first:
                raise TransferError(f"upstream {op} failed: {first['error']}")
            r = await_line(lambda: child.line(timeout=duration + 120), duration, label,
                           progress)
        if "error" in r:
            raise TransferError(f"upstream {op} failed: {r['error']}")
        return Result(**r)

    def close(self) -> None:
        self._child.close()

    def __enter__(self) -> UpstreamTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _engine() -> Any:
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("upstream TransferEngine.initialize failed")
    return engine


def _buffer(engine: Any, size: int) -> Any:
    import numpy as np

    buf = np.zeros(size, dtype=np.uint8)
    if engine.register_memory(buf.ctypes.data, size) != 0:
        raise RuntimeError(f"upstream register_memory of {size} bytes failed")
    return buf


def _target(size: int) -> None:
    engine = _engine()
    buf = _buffer(engine, size)
    emit({"port": engine.get_rpc_port(), "addr": buf.ctypes.data})
    threading.Event().wait()  # until terminated


def _initiator(job: dict[str, Any]) -> None:
    import numpy as np

    engine = _engine()
    op, block, batch, n = job["op"], job["block"], job["batch"], job["threads"]
    buf = _buffer(engine, job["buffer_size"])
    base, peer = buf.ctypes.data, job["addr"]
    target, window = f"127.0.0.1:{job['port']}", block * batch
    lwin, rwin = max(job["buffer_size"] // window, 1), max(job["peer_size"] // window, 1)
    one = engine.transfer_sync_write if op == "write" else engine.transfer_sync_read
    many = engine.batch_transfer_sync_write if op == "write" else \
        engine.batch_transfer_sync_read
    lats: list[list[float]] = [[] for _ in range(n)]
    ends, errors = [0.0] * n, []
    start = [0.0]
    barrier = threading.Barrier(n + 1, action=lambda: start.__setitem__(0, time.perf_counter()))

    def call(lo: int, ro: int) -> int:
        if batch == 1:
            return int(one(target, base + lo, peer + ro, block))
        return int(many(target, [base + lo + j * block for j in range(batch)],
                        [peer + ro + j * block for j in range(batch)], [block] * batch))

    def worker(t: int) -> None:
        lo, ro = (t % lwin) * window, (t % rwin) * window
        if call(lo, ro) != 0:
            errors.append(f"warm-up {op} returned an error")
        barrier.wait()
        clock, mine = time.perf_counter, lats[t]
        now = start[0]
        deadline = now + job["duration"]
        while now < deadline and not errors:
            rc = call(lo, ro)
            end = clock()
            if rc != 0:
                errors.append(f"{op} returned {rc}")
            mine.append(end - now)
            now = end
        ends[t] = clock()

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(n)]
    for th in threads:
        th.start()
    barrier.wait()
    emit({"event": "running"})
    for th in threads:
        th.join()
    if errors:
        emit({"error": errors[0]})
        return
    pattern = np.frombuffer(os.urandom(block), dtype=np.uint8)
    buf[:block] = pattern
    ok = engine.transfer_sync_write(target, base, peer, block) == 0
    buf[:block] = 0
    ok = ok and engine.transfer_sync_read(target, base, peer, block) == 0
    ok = ok and bool((buf[:block] == pattern).all())
    transfers = sum(len(x) for x in lats) * batch
    res = summarize("upstream", "tcp", op, block, batch, n, transfers * block, transfers,
                    max(ends) - start[0], [x for xs in lats for x in xs], ok,
                    "mooncake-transfer-engine-non-cuda, tcp, P2PHANDSHAKE")
    emit(res.to_dict())


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "target":
        _target(int(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "initiator":
        try:
            _initiator(json.loads(sys.argv[2]))
        except Exception as e:
            emit({"error": f"{type(e).__name__}: {e}"})
    else:
        sys.exit("usage: python -m mooncake_cli.bench.upstream target SIZE | initiator JSON")
