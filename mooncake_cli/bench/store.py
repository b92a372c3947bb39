"""`bench store`: our store client against a master, next to upstream's store, row by row.

    with StoreBench(BenchStoreConfig(), TransferConfig(), Registry.from_env()) as bench:
        reports = [bench.run(row) for row in bench.rows()]

*local* mode: one client contributing the segment, so every replica is local (what upstream
measures with one client). *remote*: the benchmarking client contributes nothing and a second
client process (`mooncake store serve`, or upstream's own holder) holds every replica. With no
`master` given our master runs in a child process (`python -m mooncake_cli.store.service`).
With `compare_upstream`, upstream's `mooncake_master` and `MooncakeDistributedStore` (tcp) run
each row in turn with ours, `rounds` turns each of duration/rounds, so the drift of a shared host
falls on both sides; a row's ratios are the medians of its turns' ratios.
"""

from __future__ import annotations

import statistics
import sys
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from mooncake_cli.bench import store_workload as wl
from mooncake_cli.bench.stats import Child, Progress, Result
from mooncake_cli.config import TransferConfig, human_size, parse_size, size_field
from mooncake_cli.interfaces import ConfigError, MooncakeError
from mooncake_cli.registry import Registry
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import StoreError
from mooncake_cli.transfer.engine import TransferEngine

MODES = ("local", "remote")


@dataclass(frozen=True)
class BenchStoreConfig:
    """A store benchmark ([bench_store] in the config file)."""

    mode: str = "local"
    master: str = ""  # HOST:PORT of a running master; empty: start one
    sizes: str = "4KiB,128KiB,1MiB,4MiB"
    batches: str = "1,16"
    duration: float = 2.0
    iterations: int = 0  # calls per row at most; 0: no limit
    segment_size: int = size_field(1 << 30, "bytes the holding client contributes")
    compare_upstream: bool = False
    tensor_sizes: str = "16MiB"  # bf16 tensors of the put_tensor/get_tensor rows; "": none
    rounds: int = 3  # with --compare-upstream: ours and upstream's alternate, duration/rounds each

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)}, not '{self.mode}'")
        if self.duration <= 0:
            raise ConfigError(f"--duration must be > 0 seconds, not {self.duration:g}")
        if not 1 <= self.rounds <= 100:
            raise ConfigError(f"--rounds must be in [1, 100], not {self.rounds}")
        if self.iterations < 0:
            raise ConfigError(f"--iterations must be >= 0 (0: no limit), not {self.iterations}")
        need = max(max(self.size_list) * max(self.batch_list) * 2,
                   max(self.tensor_size_list, default=0) * 16 + (16 << 10))
        if self.segment_size < need:
            raise ConfigError(f"--segment-size {human_size(self.segment_size)} cannot hold two "
                              f"batches of the largest value (16 of the largest tensor); give at "
                              f"least {human_size(need)}")

    @property
    def size_list(self) -> list[int]:
        try:
            sizes = [parse_size(s) for s in self.sizes.split(",") if s.strip()]
        except ConfigError as e:
            raise ConfigError(f"--sizes: {e}") from None
        if not sizes or min(sizes) < 1:
            raise ConfigError("--sizes needs value sizes >= 1 byte, e.g. 4KiB,1MiB")
        return sizes

    @property
    def tensor_size_list(self) -> list[int]:
        try:
            return [parse_size(s) for s in self.tensor_sizes.split(",") if s.strip()]
        except ConfigError as e:
            raise ConfigError(f"--tensor-sizes: {e}") from None

    @property
    def batch_list(self) -> list[int]:
        try:
            batches = [int(b) for b in self.batches.split(",") if b.strip()]
        except ValueError:
            raise ConfigError(f"--batches must be integers, e.g. 1,16; not {self.batches!r}") \
                from None
        if not batches or min(batches) < 1:
            raise ConfigError("--batches needs batch sizes >= 1, e.g. 1,16")
        return batches


@dataclass
class Report:
    """One row: ours, upstream's when compared, and ours / upstream."""

    row: wl.Row
    results: list[Result]
    ratio: float | None = None  # GB/s ratio (ops/s for exists); >1: ours is faster
    p50_ratio: float | None = None  # our p50 over upstream's; <1: ours is faster
    skipped: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"row": self.row.to_dict(), "results": [r.to_dict() for r in self.results],
                "ratio": self.ratio, "p50_ratio": self.p50_ratio, "skipped": self.skipped}


class _Ours:
    """The workload's Store over our StoreClient (per-key errors raise)."""

    def __init__(self, client: StoreClient) -> None:
        from mooncake_cli.compat.store import MooncakeDistributedStore

        self.c = client
        self.compat = MooncakeDistributedStore.over(client)

    def put(self, key: str, value: bytes) -> None:
        self.c.put(key, value)

    def batch_put(self, keys: list[str], values: list[bytes]) -> None:
        for err in self.c.batch_put(keys, values):
            if err is not None:
                raise err

    def get(self, key: str) -> bytes:
        return self.c.get(key)

    def batch_get(self, keys: list[str]) -> list[bytes]:
        out = self.c.batch_get(keys)
        for v in out:
            if isinstance(v, StoreError):
                raise v
        return out  # type: ignore[return-value]

    def exists(self, key: str) -> bool:
        return self.c.exists(key)

    # tensor rows: upstream's tensor API through our compat class (what a port runs)
    def put_tensor(self, key: str, tensor: Any) -> None:
        if (rc := self.compat.put_tensor(key, tensor)) != 0:
            raise MooncakeError(f"put_tensor {key!r} returned {rc}")

    def batch_put_tensor(self, keys: list[str], tensors: list[Any]) -> None:
        rcs = self.compat.batch_put_tensor(keys, tensors)
        if any(rcs):
            raise MooncakeError(f"batch_put_tensor returned {rcs}")

    def get_tensor(self, key: str) -> Any:
        return self.compat.get_tensor(key)

    def batch_get_tensor(self, keys: list[str]) -> list[Any]:
        return list(self.compat.batch_get_tensor(keys))

    def clear(self) -> None:
        self.c.remove_all(force=True)


class StoreBench:
    """Masters, holders and clients, started once; `run(row)` measures every side of it."""

    def __init__(self, cfg: BenchStoreConfig, base: TransferConfig, registry: Registry,
                 config_file: str | None = None, progress: Progress | None = None) -> None:
        self.cfg, self.progress = cfg, progress
        self._children: list[Any] = []
        self._engine: TransferEngine | None = None
        self._client: StoreClient | None = None
        self._up: Any = None
        self.upstream_skip = ""
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}"
        remote = cfg.mode == "remote"
        try:
            self.master = cfg.master or self._start_master()
            self.holder = ""
            if remote:
                argv = [sys.executable, "-m", "mooncake_cli", "--json"] + (
                    ["--config", config_file] if config_file else []) + [
                    "store", "serve", "--master", self.master, "--segment-size",
                    str(cfg.segment_size)]
                self.holder = self._spawn(argv, "the holding client (store serve)")["segment"]
            self._engine = TransferEngine(base, registry)
            self._client = StoreClient(self.master, self._engine,
                                       0 if remote else cfg.segment_size,
                                       secret=base.secret or None)
            self.store = _Ours(self._client)
            if cfg.compare_upstream:
                self._start_upstream()
        except BaseException:
            self.close()
            raise

    def _spawn(self, argv: list[str], what: str) -> dict[str, Any]:
        child = Child(argv, what)
        self._children.append(child)
        info = child.line(timeout=60)
        if "error" in info:
            raise MooncakeError(f"{what}: {info['error']}")
        return info

    def _start_master(self) -> str:
        info = self._spawn([sys.executable, "-m", "mooncake_cli.store.service", "--port", "0"],
                           "our master (mooncake_cli.store.service)")
        return str(info["address"])

    def _start_upstream(self) -> None:
        from mooncake_cli.bench import store_upstream as up

        ok, why = up.available()
        if not ok:
            self.upstream_skip = why
            return
        master = up.UpstreamMaster()
        self._children.append(master)
        if self.cfg.mode == "remote":
            self._children.append(up.UpstreamClient(master.address, self.cfg.segment_size,
                                                    "holder"))
        self._up = up.UpstreamClient(master.address,
                                     0 if self.cfg.mode == "remote" else self.cfg.segment_size)
        self._children.append(self._up)

    def rows(self) -> list[wl.Row]:
        from mooncake_cli.bench.store_tensors import BATCHES, OPS

        tensor = [wl.Row(op, size, b) for size in self.cfg.tensor_size_list for b in BATCHES
                  for op in OPS]
        return wl.rows(self.cfg.size_list, self.cfg.batch_list) + tensor

    def run(self, row: wl.Row) -> Report:
        """Ours, then upstream's when compared: in `rounds` alternating turns of
        duration/rounds each, so that the drift of a shared host falls on both sides; the
        ratios are the medians of the turns' ratios."""
        cfg = self.cfg
        what = f"{row.op} {human_size(row.size)} x{row.batch}"
        via = "local" if cfg.mode == "local" else self._via()
        turns = cfg.rounds if self._up is not None else 1
        if cfg.iterations:  # the row's calls at most, shared out over the turns
            turns = min(turns, cfg.iterations)
        mine: list[Result] = []
        theirs: list[Result] = []
        for turn in range(turns):
            tag = f" ({turn + 1}/{turns})" if turns > 1 else ""
            iterations = (cfg.iterations // turns + (turn < cfg.iterations % turns)
                          if cfg.iterations else 1 << 62)
            mine.append(wl.run_row(self.store, row, cfg.duration / turns, iterations, "ours",
                                   via, self.progress, f"ours {what}{tag}", self.prefix))
            if self._up is not None:
                theirs.append(self._up.measure(row, cfg.duration / turns, iterations,
                                               self.progress, f"upstream {what}{tag}",
                                               "local" if via == "local" else "tcp"))
        rep = Report(row, [merged(mine)])
        if theirs:
            rep.results.append(merged(theirs))
            key = "transfers_per_s" if row.op == "exists" else "gbps"
            rep.ratio = _median([getattr(a, key) / getattr(b, key)
                                 for a, b in zip(mine, theirs, strict=True) if getattr(b, key)])
            rep.p50_ratio = _median([a.p50_us / b.p50_us for a, b in zip(mine, theirs, strict=True)
                                     if a.p50_us and b.p50_us])
        elif cfg.compare_upstream:
            rep.skipped["upstream"] = self.upstream_skip
        bad = [r for r in rep.results if r.verified is False]
        if bad:
            raise MooncakeError(f"verification failed ({bad[0].name} {what}): {bad[0].note}")
        return rep

    def _via(self) -> str:
        """The transport our client reaches the holder with."""
        try:
            return self._engine.transport_for(self.holder) if self._engine else "remote"
        except MooncakeError:
            return "remote"

    def close(self) -> None:
        for part in (self._client, self._engine, *reversed(self._children)):  # LIFO
            if part is not None:
                try:
                    part.close()
                except Exception:  # noqa: BLE001 - close the rest whatever one does
                    pass
        self._children.clear()

    def __enter__(self) -> StoreBench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _median(xs: list[float] | list[float | None], digits: int = 3) -> float | None:
    """The median of the values given (None ones left out), or None when there are none."""
    got = [x for x in xs if x is not None]
    return round(statistics.median(got), digits) if got else None


def merged(turns: list[Result]) -> Result:
    """One side's turns of a row as one Result: totals summed, the rates over the summed time,
    p50 and p99 the medians of the turns' (a turn that failed verification fails it)."""
    if len(turns) == 1:
        return turns[0]
    first = turns[0]
    nbytes, ops = sum(t.bytes for t in turns), sum(t.transfers for t in turns)
    seconds = max(sum(t.seconds for t in turns), 1e-9)
    bad = [t for t in turns if t.verified is False]
    verified = False if bad else first.verified
    return replace(first, bytes=nbytes, transfers=ops, seconds=round(seconds, 4),
                   gbps=round(nbytes / seconds / 1e9, 4),
                   transfers_per_s=round(ops / seconds, 1),
                   p50_us=_median([t.p50_us for t in turns], 2),
                   p99_us=_median([t.p99_us for t in turns], 2),
                   verified=verified, note=bad[0].note if bad else first.note)


def run(cfg: BenchStoreConfig, base: TransferConfig, registry: Registry,
        config_file: str | None = None, progress: Progress | None = None) -> list[Report]:
    """Measure every row of `cfg`."""
    with StoreBench(cfg, base, registry, config_file, progress) as bench:
        return [bench.run(row) for row in bench.rows()]
