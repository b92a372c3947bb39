"""`bench transfer`: drive the transfer engine with fixed-size batches and measure it.

As *target* it registers a buffer and serves until stopped; as *initiator* `threads` threads
each keep one batch of `batch_size` requests of `block_size` bytes outstanding for `duration`
seconds; *local* starts the target in a child process (`mooncake --json transfer serve`) so one
command measures loopback between two processes. After the run one block is written with a
pattern and read back, so a broken transport cannot report a speed.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mooncake_cli.bench.stats import Child, Progress, Result, pump, summarize
from mooncake_cli.config import TransferConfig, size_field
from mooncake_cli.interfaces import ConfigError, TransferError
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Op, State, TransferRequest
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region

MODES = ("target", "initiator", "local")


@dataclass(frozen=True)
class BenchTransferConfig:
    """A transfer benchmark ([bench_transfer] in the config file). Empty transport, metadata and
    secret mean: as the [transfer] table (or its defaults) says."""

    mode: str = "local"
    transport: str = ""
    metadata: str = ""
    op: str = "write"
    block_size: int = size_field(64 << 10, "bytes per request")
    batch_size: int = 1
    threads: int = 1
    duration: float = 5.0
    buffer_size: int = size_field(256 << 20, "bytes registered on each side")
    target: str = ""  # segment name of the target (initiator mode)
    secret: str = ""
    encrypt: bool = False  # TLS on the tcp transport (needs the secret)
    compare_upstream: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)}, not '{self.mode}'")
        if self.op not in ("read", "write"):
            raise ConfigError(f"--op must be read or write, not '{self.op}'")
        if self.block_size < 1 or self.batch_size < 1 or self.threads < 1:
            raise ConfigError("--block-size, --batch-size and --threads must be at least 1")
        if self.duration <= 0:
            raise ConfigError(f"--duration must be > 0 seconds, not {self.duration:g}")
        if self.mode != "target" and self.block_size * self.batch_size > self.buffer_size:
            raise ConfigError(f"--block-size x --batch-size ({self.block_size * self.batch_size}"
                              f" bytes) does not fit in --buffer-size ({self.buffer_size} bytes)")
        if self.mode == "initiator" and not self.target:
            raise ConfigError("--mode initiator needs --target SEGMENT (the name printed by "
                              "`mooncake bench transfer --mode target` or `transfer serve`)")

    def engine_config(self, base: TransferConfig) -> TransferConfig:
        """`base` with this benchmark's transport, metadata, secret and encrypt where set."""
        over = {k: getattr(self, k) for k in ("transport", "metadata", "secret", "encrypt")
                if getattr(self, k)}
        return dataclasses.replace(base, **over)


def serve(cfg: BenchTransferConfig, base: TransferConfig, registry: Registry,
          on_ready: Callable[[dict[str, Any]], None], wait: Callable[[], None]) -> None:
    """Target mode: register `buffer_size` bytes, call `on_ready(info)`, serve until `wait`
    returns."""
    ecfg = cfg.engine_config(base)
    with TransferEngine(ecfg, registry) as engine:
        region = engine.allocate(cfg.buffer_size)
        on_ready({"event": "ready", "segment": engine.name, "address": engine.address,
                  "metadata": ecfg.metadata, "offset": region.base, "size": cfg.buffer_size,
                  "auth": bool(ecfg.secret)})
        wait()


class LocalTarget:
    """`mooncake --json transfer serve` in a child process, for local mode."""

    def __init__(self, cfg: BenchTransferConfig, base: TransferConfig,
                 config_file: str | None = None) -> None:
        ecfg = cfg.engine_config(base)
        argv = [sys.executable, "-m", "mooncake_cli", "--json"]
        if config_file:
            argv += ["--config", config_file]
        argv += ["transfer", "serve", "--buffer-size", str(cfg.buffer_size),
                 "--metadata", ecfg.metadata]
        if ecfg.transport == "nixl":  # no peer maps it; cma pins huge pages far faster
            argv.append("--private")
        env = {"MOONCAKE_SECRET": ecfg.secret} if ecfg.secret else {}
        if ecfg.encrypt:
            env["MOONCAKE_TRANSFER_ENCRYPT"] = "1"
        self._child = Child(argv, "the local target (mooncake transfer serve)", env)
        try:
            info = self._child.line(timeout=30)
        except BaseException:
            self._child.close()
            raise
        self.segment: str = info["segment"]
        self.offset: int = int(info.get("offset", 0))

    def close(self) -> None:
        self._child.close()

    def __enter__(self) -> LocalTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _remote_base(engine: TransferEngine, target: str, need: int) -> tuple[int, int]:
    """(offset, length) of the first region of `target` that holds `need` bytes."""
    desc = engine.metadata.lookup(target)
    for r in desc.regions:
        if r.length >= need:
            return r.base, r.length
    raise ConfigError(f"segment '{target}' has no registered region of {need} bytes or more "
                      f"(block x batch); serve a larger --buffer-size")


def _check(statuses: list[Any], what: str) -> None:
    for s in statuses:
        if s.state is not State.COMPLETED:
            raise TransferError(f"{what} failed: {s.reason or 'timed out'}")


def verify(engine: TransferEngine, region: Region, target: str, remote: int, n: int) -> bool:
    """Write a pattern of `n` bytes to `target` at `remote`, read it back, compare."""
    pattern = os.urandom(n)
    view = region.view
    if view is None:
        raise ConfigError("the benchmark's local buffer must be host memory")
    view[:n] = pattern
    engine.transfer(Op.WRITE, region, 0, target, remote, n)
    view[:n] = bytes(n)
    engine.transfer(Op.READ, region, 0, target, remote, n)
    return view[:n] == pattern


def measure(engine: TransferEngine, region: Region, cfg: BenchTransferConfig, target: str,
            progress: Progress | None = None, label: str = "ours", name: str = "ours") -> Result:
    """Run the workload of `cfg` against `target` with `engine` and `region` (local buffer)."""
    window = cfg.block_size * cfg.batch_size
    rbase, rlen = _remote_base(engine, target, window)
    op = Op(cfg.op)
    timeout = max(engine.config.timeout * 2, 30.0)
    lwin, rwin = max(region.length // window, 1), max(rlen // window, 1)
    start = [0.0]
    barrier = threading.Barrier(cfg.threads + 1, action=lambda: start.__setitem__(
        0, time.perf_counter()))
    lats: list[list[float]] = [[] for _ in range(cfg.threads)]
    ends = [0.0] * cfg.threads
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        lo, ro = (t % lwin) * window, rbase + (t % rwin) * window
        reqs = [TransferRequest(op, region, lo + j * cfg.block_size, target,
                                ro + j * cfg.block_size, cfg.block_size)
                for j in range(cfg.batch_size)]
        mine = lats[t]
        try:
            _check(engine.submit(reqs).wait(timeout), f"warm-up {cfg.op}")
        except BaseException as e:
            errors.append(e)
            barrier.abort()
            return
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        deadline = start[0] + cfg.duration
        clock, submit = time.perf_counter, engine.submit
        try:
            now = clock()
            while now < deadline:
                statuses = submit(reqs).wait(timeout)
                end = clock()
                mine.append(end - now)
                _check(statuses, cfg.op)
                now = end
        except BaseException as e:
            errors.append(e)
        ends[t] = clock()

    threads = [threading.Thread(target=worker, args=(t,), name=f"bench-{t}", daemon=True)
               for t in range(cfg.threads)]
    for th in threads:
        th.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    pump(lambda: not any(th.is_alive() for th in threads), cfg.duration, label, progress)
    if errors:
        raise errors[0] if isinstance(errors[0], Exception) else TransferError(str(errors[0]))
    transfers = sum(len(x) for x in lats) * cfg.batch_size
    seconds = max(ends) - start[0]
    ok = verify(engine, region, target, rbase, cfg.block_size)
    if not ok:
        raise TransferError(f"verification failed: a {cfg.block_size}-byte block written to "
                            f"'{target}' did not read back the same")
    return summarize(name, engine.transport_for(target), cfg.op, cfg.block_size,
                     cfg.batch_size, cfg.threads, transfers * cfg.block_size, transfers,
                     seconds, [x for xs in lats for x in xs], ok)
