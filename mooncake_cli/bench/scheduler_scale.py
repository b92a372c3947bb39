"""`mooncake bench scheduler`: how long one scheduling decision takes as the cluster grows.

For each size N: N prefill and N decode instances on the FAST'25 cost model, the prefix index
filled with every request's blocks of a trace (each request's blocks on one prefill instance
drawn at random, seeded, in arrival order; no capacity, so nothing is evicted), seeded queues
(80% of prefill instances busy for up to 5 s, decode batches of 0-32 requests). Then requests
drawn from the trace are decided one after another: each decision (`Scheduler.schedule`) is
timed alone (wall clock, and the thread's CPU time, which a busy machine's other processes
do not inflate); it is then booked (`commit`) and its blocks stored on the chosen instance, as its
prefill would, before the next one. Memory per indexed block is what tracemalloc saw the index
allocate while it was filled, divided by its (instance, block) entries and by its distinct
keys; the keys themselves (the trace's ints) are not counted.
"""

from __future__ import annotations

import gc
import random
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.costmodel import paper
from mooncake_cli.scheduler.scheduler import POLICIES, Decision, Scheduler, make_policy
from mooncake_cli.scheduler.state import Cluster, Request
from mooncake_cli.sim.trace import TraceRequest, load_trace

Progress = Callable[[str, int, int], None]  # (label, done, total)
Decide = Callable[[Scheduler, Request, float], tuple[str, str | None]]


@dataclass(frozen=True)
class ScaleConfig:
    """What `mooncake bench scheduler` measures."""

    trace: str
    instances: tuple[int, ...] = (1000, 10000)
    requests: int = 2000  # timed decisions per size
    warmup: int = 100  # decisions made (and booked) before timing starts
    policy: str = "kvcache-centric"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.instances or min(self.instances) < 1:
            raise ConfigError("--instances must be counts >= 1, e.g. 1000,10000")
        if self.requests < 1 or self.warmup < 0:
            raise ConfigError("--requests must be >= 1 and --warmup >= 0")
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown policy '{self.policy}': use one of "
                              f"{', '.join(POLICIES)}")


def parse_sizes(text: str) -> tuple[int, ...]:
    """'1000,10000' -> (1000, 10000); ConfigError for anything else."""
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"--instances must be counts >= 1 separated by commas, not {text!r}")
    return sizes


def build(n: int, reqs: list[TraceRequest], policy: str, seed: int) -> tuple[Scheduler,
                                                                            dict[str, Any]]:
    """A scheduler over n prefill + n decode instances, the index filled with `reqs`' blocks;
    and what filling it took (seconds, bytes, entries, keys)."""
    rng = random.Random(seed)
    cluster = Cluster(paper())
    names = [f"p{j:05d}" for j in range(n)]
    for name in names:
        cluster.add(name, "prefill")
    for j in range(n):
        cluster.add(f"d{j:05d}", "decode")
    index = cluster.index
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    for r in reqs:
        index.store(names[rng.randrange(n)], r.hash_ids)
    fill_s = time.perf_counter() - t0
    grew = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    for inst in cluster.prefill:
        if rng.random() < 0.8:
            inst.busy_until = rng.uniform(0.0, 5.0)
    for inst in cluster.decode:
        inst.batch = rng.randint(0, 32)
        inst.context_tokens = inst.batch * rng.randint(1000, 8000)
    entries = sum(index.blocks(name) for name in names)
    keys = index.key_count()
    return Scheduler(cluster, make_policy(policy, seed)), {
        "fill_s": round(fill_s, 3), "index_bytes": grew, "index_entries": entries,
        "distinct_keys": keys, "bytes_per_entry": round(grew / max(1, entries), 1),
        "bytes_per_key": round(grew / max(1, keys), 1),
        "most_holders": index.most_holders()}


def _us(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1e6, 1)


def measure(sched: Scheduler, reqs: list[TraceRequest], warmup: int,
            progress: Callable[[int, int], None] | None = None,
            check: Decide | None = None) -> dict[str, Any]:
    """Decide, book and store `reqs` in turn at time 0; the timing of all but the first
    `warmup` decisions (µs), and with `check` how many of them it agreed with."""
    lat: list[float] = []
    cpu: list[float] = []
    agree = 0
    cluster = sched.cluster
    for i, r in enumerate(reqs):
        req = Request(str(r.index), r.input_tokens, r.output_tokens, r.hash_ids)
        c0 = time.thread_time()
        t0 = time.perf_counter()
        d: Decision = sched.schedule(req, 0.0)
        dt = time.perf_counter() - t0
        dc = time.thread_time() - c0
        if check is not None:
            agree += check(sched, req, 0.0) == (d.prefill, d.decode)
        if i >= warmup:
            lat.append(dt)
            cpu.append(dc)
        sched.commit(d, req, 0.0)
        cluster.index.store(d.prefill, r.hash_ids)
        if progress is not None and (i % 100 == 0 or i == len(reqs) - 1):
            progress(i + 1, len(reqs))
    out: dict[str, Any] = {"decisions": len(lat), "p50_us": _us(lat, 0.5),
                           "p99_us": _us(lat, 0.99), "max_us": _us(lat, 1.0),
                           "mean_us": round(sum(lat) / len(lat) * 1e6, 1),
                           "cpu_p50_us": _us(cpu, 0.5), "cpu_p99_us": _us(cpu, 0.99)}
    if check is not None:
        out["agree_with_reference"] = agree
        out["checked"] = len(reqs)
    return out


def run(cfg: ScaleConfig, progress: Progress | None = None,
        check: Decide | None = None) -> dict[str, Any]:
    """Every size in `cfg.instances`, one row each."""
    trace = load_trace(cfg.trace)
    pick = random.Random(cfg.seed + 1)
    timed = [trace[i] for i in pick.sample(range(len(trace)),
                                           min(len(trace), cfg.warmup + cfg.requests))]
    rows = []
    for n in cfg.instances:
        label = f"{n} instances"
        sched, filled = build(n, trace, cfg.policy, cfg.seed)
        report = None if progress is None else (
            lambda done, total, label=label: progress(label, done, total))
        rows.append({"instances": n, "prefill": n, "decode": n, **filled,
                     **measure(sched, timed, min(cfg.warmup, len(timed) - 1), report, check)})
        del sched
        gc.collect()
    return {"trace": cfg.trace, "trace_requests": len(trace), "policy": cfg.policy,
            "model": paper().name, "seed": cfg.seed, "rows": rows}
