"""`bench chaos --serving`: decode workers killed with SIGKILL under concurrent greedy streams;
every answer must still come out whole, the same as without kills (request migration).

    report = run(ServingChaosConfig(streams=100, decode=3, kill_every=10), progress)

One cluster of processes (`serving_procs`): a store master, the conductor, one prefill and
`decode` decode workers of `model`. In order, all in this one run:

1. warm-up: every prompt once with max_tokens 1, so the store holds the prompts' blocks;
2. clean: `streams` concurrent greedy streams (prompts sharing a long prefix), no kills: the
   reference texts;
3. write-behind's cost (`write_behind_cost`): another `streams` prompts the same way, on these
   decode workers (write-behind on), then twice on decode workers without it, then once more
   on fresh ones with it (each change of workers followed by a warm-up);
4. chaos: the prompts of 2 again; every `kill_every` seconds (once all `decode` workers are up)
   one decode worker running requests, chosen at random, gets SIGKILL and a fresh one is
   started in its place. Counted: streams whose text equals the clean run's, streams that
   failed, the conductor's migrations, the added latency of a moved stream (its largest gap
   between two tokens minus the same stream's in the clean run; moved streams are those the
   conductor's explain log shows placed again, with how long those placements waited), and
   blocks reused and recomputed per migration (the conductor's migration token counters over
   the block size).
"""

from __future__ import annotations

import math
import random
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mooncake_cli.bench.serving_procs import ServingCluster, ServingSpec
from mooncake_cli.bench.serving_streams import Stream, prompts, run_streams, throughput
from mooncake_cli.bench.write_behind_cost import Run, compare, measure
from mooncake_cli.interfaces import ConfigError

Progress = Callable[[str, int, int], None]  # (phase, done, total)
BLOCK = 16
MIGRATION = "mooncake_conductor_migration"


@dataclass(frozen=True)
class ServingChaosConfig:
    """[bench_chaos_serving] in the config file."""

    model: str = "smollm2-135m"
    streams: int = 100
    decode: int = 3
    kill_every: float = 10.0
    max_tokens: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if self.streams < 1 or self.max_tokens < 1:
            raise ConfigError("--streams and --max-tokens must be >= 1")
        if self.decode < 2:
            raise ConfigError(f"--decode must be >= 2 (a moved request needs another decode "
                              f"worker), not {self.decode}")
        if self.kill_every <= 0:
            raise ConfigError(f"--kill-every must be > 0 seconds, not {self.kill_every:g}")

    def kv_blocks(self, prompt_tokens: int) -> int:
        """KV blocks per decode worker: every stream fits on `decode` - 1 of them."""
        per = math.ceil((prompt_tokens + self.max_tokens) / BLOCK) + 1
        return max(64, math.ceil(self.streams * per / (self.decode - 1)) + BLOCK)


def _longest(model: str, texts: list[str]) -> int:
    """Tokens of the longest prompt, by the model's own tokenizer."""
    from mooncake_cli.engine.errors import ModelError
    from mooncake_cli.engine.source import open_source

    try:
        tokenizer = open_source(model).tokenizer
    except ModelError as e:
        raise ConfigError(str(e)) from None
    return max(len(tokenizer.encode(t)) for t in texts)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


def _errors(streams: list[Stream]) -> list[str]:
    return [f"stream {s.index}: {s.error}" for s in streams if s.error]


def _streams(cluster: ServingCluster, texts: list[str], max_tokens: int, phase: str,
             progress: Progress) -> list[Stream]:
    progress(phase, 0, len(texts))
    return run_streams(cluster.url, cluster.model, texts, max_tokens,
                       lambda d, t: progress(phase, d, t))


def _warm(cluster: ServingCluster, texts: list[str], phase: str, progress: Progress) -> None:
    """Every prompt once with max_tokens 1 (the first alone: the others reuse its prefix)."""
    _streams(cluster, texts[:1], 1, phase, progress)
    _streams(cluster, texts, 1, phase, progress)


def _chaos(cluster: ServingCluster, cfg: ServingChaosConfig, texts: list[str],
           progress: Progress) -> tuple[list[Stream], list[dict[str, Any]]]:
    """The streams of `texts` with a decode worker killed every `kill_every` seconds."""
    box: list[list[Stream]] = []
    th = threading.Thread(target=lambda: box.append(
        _streams(cluster, texts, cfg.max_tokens, "chaos", progress)), daemon=True)
    rng = random.Random(cfg.seed)
    kills: list[dict[str, Any]] = []
    t0 = time.monotonic()
    next_kill = t0 + cfg.kill_every
    th.start()
    while th.is_alive():
        if cluster.adopt_ready() and time.monotonic() >= next_kill:
            killed = cluster.kill_busy_decode(rng)
            if killed is not None:
                killed["at_s"] = round(time.monotonic() - t0, 2)
                kills.append(killed)
                next_kill = time.monotonic() + cfg.kill_every
        th.join(0.1)
    if not box:
        raise RuntimeError("the chaos run's client failed")
    return box[0], kills


def _added_latency(clean: list[Stream], chaos: list[Stream], moved: set[str]
                   ) -> dict[str, Any]:
    added = []
    for ref, s in zip(clean, chaos, strict=True):
        gap, ref_gap = s.max_gap(), ref.max_gap()
        if s.rid in moved and gap is not None and ref_gap is not None:
            added.append(gap - ref_gap)
    return {"source": "client: a moved stream's largest gap between two tokens minus the "
                      "same stream's in the clean run", "streams": len(added),
            "p50_s": _pct(added, 0.5), "p99_s": _pct(added, 0.99),
            "samples_s": [round(a, 3) for a in added]}


def _chaos_report(cluster: ServingCluster, clean: list[Stream], chaos: list[Stream],
                  kills: list[dict[str, Any]], before: dict[str, float]) -> dict[str, Any]:
    after = cluster.conductor_metrics()

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    migrations = delta("mooncake_conductor_migrations_total")
    gaps = delta(MIGRATION + "_gap_seconds_count")
    placements = cluster.migrations()
    moved = {str(r["request"]).rpartition(".m")[0] for r in placements}
    waited = [float(r.get("queue", {}).get("waited_s", 0.0)) for r in placements]
    prefill_queue = [float(r["prefill"]["queue_s"]) for r in placements]
    reused = delta(MIGRATION + "_reused_tokens_total")
    recomputed = delta(MIGRATION + "_recomputed_tokens_total")
    per = (lambda tokens: tokens / BLOCK / migrations) if migrations else (lambda _: None)
    return {
        "streams": len(chaos),
        "identical": sum(s.ok and s.text == ref.text for ref, s in zip(clean, chaos,
                                                                         strict=True)),
        "errors": sum(not s.ok for s in chaos),
        "differs": sum(s.ok and s.text != ref.text for ref, s in zip(clean, chaos,
                                                                       strict=True)),
        "failures": _errors(chaos), "conductor_errors": cluster.conductor_errors(),
        "kills": kills, "migrations": int(migrations),
        "moved_streams": sum(s.rid in moved for s in chaos),
        "added_latency": _added_latency(clean, chaos, moved),
        "migration_placement": {  # where a moved answer waits before its new prefill runs
            "queue_wait_p50_s": _pct(waited, 0.5), "queue_wait_p99_s": _pct(waited, 0.99),
            "prefill_queue_estimate_p50_s": _pct(prefill_queue, 0.5)},
        "conductor_migration_gap": {"count": int(gaps), "mean_s": delta(
            MIGRATION + "_gap_seconds_sum") / gaps if gaps else None},
        "reused_tokens": int(reused), "recomputed_tokens": int(recomputed),
        "reused_blocks_per_migration": per(reused),
        "recomputed_blocks_per_migration": per(recomputed),
        **throughput(chaos)}


def _restart(cluster: ServingCluster, write_behind: bool, texts: list[str],
             progress: Progress) -> None:
    what = "write-behind workers" if write_behind else "workers without write-behind"
    progress(what, 0, 1)
    cluster.start_decodes(write_behind)
    progress(what, 1, 1)
    _warm(cluster, texts, "warm-up again", progress)


def run(cfg: ServingChaosConfig, progress: Progress) -> dict[str, Any]:
    """The whole benchmark (see the module docstring); its report."""
    texts = prompts(2 * cfg.streams)
    ref_texts, load_texts = texts[:cfg.streams], texts[cfg.streams:]
    spec = ServingSpec(cfg.model, cfg.decode, cfg.kv_blocks(_longest(cfg.model, texts)), BLOCK)
    with tempfile.TemporaryDirectory(prefix="mooncake-chaos-serving-") as tmp:
        progress("starting the cluster", 0, 1)
        with ServingCluster(spec, Path(tmp)) as cluster:
            cluster.start_decodes(write_behind=True)
            progress("starting the cluster", 1, 1)
            _warm(cluster, texts, "warm-up", progress)
            clean = _streams(cluster, ref_texts, cfg.max_tokens, "clean", progress)

            def load(phase: str) -> Run:
                return measure(cluster, lambda: _streams(cluster, load_texts, cfg.max_tokens,
                                                         phase, progress))
            on = [load("write-behind on")]
            _restart(cluster, False, texts, progress)
            off = [load("write-behind off"), load("write-behind off again")]
            _restart(cluster, True, texts, progress)
            on.append(load("write-behind on again"))
            before = cluster.conductor_metrics()
            chaos, kills = _chaos(cluster, cfg, ref_texts, progress)
            report = _chaos_report(cluster, clean, chaos, kills, before)
            model = cluster.model
    return {"config": asdict(cfg), "model": model, "kv_blocks_per_decode": spec.kv_blocks,
            "clean": throughput(clean) | {"errors": sum(not s.ok for s in clean),
                                          "failures": _errors(clean)},
            "chaos": report, "write_behind": compare(off, on)}
