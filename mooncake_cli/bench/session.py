"""One benchmark session: our initiator engine and its target (a local child process or a
given segment), plus the upstream wheel and the physical references, all measured in the same
run and reported with ratios. A `--sweep` reuses the same targets for every workload.

Over nixl the references are the bare NIXL API (same agent and peer, no engine), our own tcp
(a second engine forced onto tcp, against the same target) and single-thread memcpy, so one
table holds nixl, tcp, memcpy and upstream's tcp.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from mooncake_cli.bench import baselines
from mooncake_cli.bench.stats import Progress, Result
from mooncake_cli.bench.transfer import BenchTransferConfig, LocalTarget, measure
from mooncake_cli.config import TransferConfig, human_size, parse_size
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.engine import TransferEngine


@dataclass
class Report:
    """One workload: every row measured for it and ours / each other row in GB/s."""

    workload: dict[str, Any]
    results: list[Result]
    ratios: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # row -> why it did not run

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "results": [r.to_dict() for r in self.results],
                "ratios": self.ratios, "skipped": self.skipped}


def workloads(cfg: BenchTransferConfig, sweep: str | None) -> list[BenchTransferConfig]:
    """`cfg` alone, or one config per (block size in `sweep`, op) with both ops."""
    if not sweep:
        return [cfg]
    sizes = [parse_size(s) for s in sweep.split(",") if s.strip()]
    if not sizes:
        raise ConfigError("--sweep needs a comma-separated list of block sizes, e.g. 64KiB,1MiB")
    too_big = [s for s in sizes if s * cfg.batch_size > cfg.buffer_size]
    if too_big:
        raise ConfigError(f"--sweep block {human_size(max(too_big))} x --batch-size "
                          f"{cfg.batch_size} does not fit in --buffer-size "
                          f"{human_size(cfg.buffer_size)}")
    return [dataclasses.replace(cfg, block_size=s, op=op) for s in sizes
            for op in ("write", "read")]


def check_mode(cfg: BenchTransferConfig) -> None:
    if cfg.mode == "target":
        raise ConfigError("--mode target serves a buffer: it measures nothing itself")
    if cfg.compare_upstream and cfg.mode != "local":
        raise ConfigError("--compare-upstream needs --mode local: the upstream pair runs on "
                          "loopback, so ours must too for the ratio to mean anything")


class TransferBench:
    """Targets and our engine, started once; `run(workload)` measures every row of it."""

    def __init__(self, cfg: BenchTransferConfig, base: TransferConfig, registry: Registry,
                 config_file: str | None = None, progress: Progress | None = None) -> None:
        check_mode(cfg)
        self.cfg, self.progress = cfg, progress
        size = cfg.buffer_size
        self._local: LocalTarget | None = None
        self._upstream: Any = None
        self._tcp: TransferEngine | None = None  # our tcp beside nixl
        self.upstream_skip = ""
        self.engine = TransferEngine(cfg.engine_config(base), registry)
        try:
            if cfg.mode == "local":
                self._local = LocalTarget(cfg, base, config_file)
                self.target = self._local.segment
            else:
                self.target = cfg.target
            self.region = self.engine.allocate(size, shared=False)
            self.transport = self.engine.transport_for(self.target)
            if self.transport == "nixl":
                self._tcp = TransferEngine(dataclasses.replace(cfg.engine_config(base),
                                                               transport="tcp"), registry)
                self._tcp_region = self._tcp.allocate(size, shared=False)
            if cfg.compare_upstream:
                from mooncake_cli.bench import upstream

                ok, why = upstream.available()
                if ok:
                    self._upstream = upstream.UpstreamTarget(size)
                else:
                    self.upstream_skip = why
        except BaseException:
            self.close()
            raise

    def _references(self, w: BenchTransferConfig) -> tuple[list[Result], dict[str, str]]:
        what = f"{w.op} {human_size(w.block_size)}"
        if self._tcp is not None:
            from mooncake_cli.bench import nixl_raw

            return [nixl_raw.measure(self.engine, self.region, self.target, w.op, w.block_size,
                                     w.duration, self.progress, f"nixl api {what}"),
                    measure(self._tcp, self._tcp_region, w, self.target, self.progress,
                            f"tcp {what}", name="tcp"),
                    baselines.memcpy(w.block_size, w.duration, self.progress, w.op,
                                     f"memcpy {what}")], {}
        if self.transport in ("shm", "local"):
            return [baselines.memcpy(w.block_size, w.duration, self.progress, w.op,
                                     f"memcpy {what}")], {}
        if self.transport == "tcp" and w.mode == "local":
            return [baselines.socket_stream(w.op, w.block_size, w.duration, self.progress,
                                            f"socket {what}")], {}
        why = ("the target may be on another host: a loopback stream is no reference"
               if self.transport == "tcp" else f"no physical reference for {self.transport}")
        return [], {"reference": why}

    def run(self, w: BenchTransferConfig) -> Report:
        workload = {"op": w.op, "block_size": w.block_size, "batch_size": w.batch_size,
                    "threads": w.threads, "duration": w.duration, "mode": w.mode,
                    "transport": self.transport, "target": self.target}
        what = f"{w.op} {human_size(w.block_size)}"
        ours = measure(self.engine, self.region, w, self.target, self.progress, f"ours {what}")
        rows, skipped = [ours], {}
        if self._upstream is not None:
            rows.append(self._upstream.measure(w.op, w.block_size, w.batch_size, w.threads,
                                               w.duration, self.region.length, self.progress,
                                               f"upstream {what}"))
        elif self.cfg.compare_upstream:
            skipped["upstream"] = self.upstream_skip
        refs, why = self._references(w)
        rows += refs
        skipped.update(why)
        ratios = {r.name: round(ours.gbps / r.gbps, 3) for r in rows[1:] if r.gbps > 0}
        return Report(workload, rows, ratios, skipped)

    def close(self) -> None:
        for part in (self._upstream, self._tcp, self._local, self.engine):
            if part is not None:
                try:
                    part.close()
                except Exception:  # tear everything down even when one part fails
                    pass

    def __enter__(self) -> TransferBench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run(cfg: BenchTransferConfig, base: TransferConfig, registry: Registry,
        sweep: str | None = None, config_file: str | None = None,
        progress: Progress | None = None) -> list[Report]:
    """Measure `cfg` (or each workload of `sweep`) with every row that applies."""
    check_mode(cfg)
    jobs = workloads(cfg, sweep)
    with TransferBench(cfg, base, registry, config_file, progress) as bench:
        return [bench.run(j) for j in jobs]
