"""`mooncake bench trace --url URL | --local P,D`: replay a trace against a live conductor.

With --local and both kvcache-centric and kvcache-pipeline among the policies, the report also
holds the simulator's prediction for the same requests and cluster (bench/trace_predict.py),
under the cost model the kvcache-centric run's conductor learned."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from mooncake_cli.bench.trace_live import ReplayConfig, long_prompts, replay
from mooncake_cli.bench.trace_predict import CENTRIC, gains, learned_model, predict, sim_model
from mooncake_cli.commands import bench_plot
from mooncake_cli.commands.bench_trace_show import live_table
from mooncake_cli.config.conductor import PIPELINE, ConductorConfig
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out
from mooncake_cli.scheduler.scheduler import POLICIES
from mooncake_cli.sim.trace import load_trace
from mooncake_cli.worker.engines import NATIVE, worker_class


@dataclass(frozen=True)
class LocalSetup:
    """What --local starts for each policy: workers' engine, KV blocks and torch threads, the
    block size of workers and conductor, and the pipeline options every conductor gets (only
    kvcache-pipeline uses them)."""

    kv_blocks: int = 512
    threads: int = 0
    max_stages: int = 2
    pipeline_chunk: int = 2048
    pipeline_min_gain: float = 0.3
    engine: str = NATIVE
    block_size: int = 16

    def conductor(self, model: str, policy: str) -> ConductorConfig:
        return ConductorConfig(port=0, model=model, policy=policy, max_stages=self.max_stages,
                               pipeline_chunk=self.pipeline_chunk,
                               pipeline_min_gain=self.pipeline_min_gain,
                               block_size=self.block_size)

    def worker(self) -> WorkerConfig:
        return WorkerConfig(kv_blocks=self.kv_blocks, threads=self.threads, engine=self.engine)

    def check(self, model: str, policies: list[str]) -> None:
        """ConfigError for a bad option, PluginError for an engine not installed: before any
        run."""
        if self.engine != NATIVE and PIPELINE in policies:
            raise ConfigError(f"--policy {PIPELINE} runs pipeline stages on our engine's "
                              f"prefill workers only; with --engine {self.engine} leave it "
                              "out")
        self.conductor(model, PIPELINE)
        self.worker()
        worker_class(self.engine, "prefill")


def _updater(bar: Progress, task: TaskID) -> Callable[[int, int], None]:
    return lambda done, total: bar.update(task, completed=done)


def _policies(policy: str | None) -> list[str]:
    names = [x.strip() for x in (policy or "random,kvcache-centric").split(",")]
    bad = [x for x in names if x not in POLICIES]
    if bad or not names:
        raise ConfigError(f"unknown policy {', '.join(bad) or '(none)'}: use "
                          f"{', '.join(POLICIES)}")
    return names


def _against_centric(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each other policy's mean TTFT over kvcache-centric's, and kvcache-centric's prefix-hit
    ratio less the other's."""
    b = runs.get(CENTRIC)
    out: dict[str, float] = {}
    for name, a in runs.items():
        if b is None or name == CENTRIC or not (a["ttft_s"]["mean"] and b["ttft_s"]["mean"]):
            continue
        out[f"mean TTFT {name}/{CENTRIC}"] = a["ttft_s"]["mean"] / b["ttft_s"]["mean"]
        out[f"hit ratio {CENTRIC} - {name}"] = b["prefix_hit_ratio"] - a["prefix_hit_ratio"]
    return out


def run_live(out: Out, trace_file: str, url: str | None, local: str | None, model: str,
             policy: str | None, time_scale: float, limit: int | None, cfg: ReplayConfig,
             setup: LocalSetup, plot: str | None = None, min_input: int = 0) -> None:
    if bool(url) == bool(local):
        raise ConfigError("give either --url (a running conductor) or --local P,D")
    bench_plot.check(plot)
    per_run: dict[str, dict[str, list[float]]] = {}  # run -> {"ttft": [...], "tbt": [...]}
    reqs = long_prompts(load_trace(trace_file, time_scale, limit or 200), cfg, min_input)
    runs: dict[str, dict[str, Any]] = {}
    learned: dict[str, dict[str, Any] | None] = {}  # policy -> its conductor's cost model
    bar = Progress(TextColumn("{task.description:<18}"), BarColumn(), MofNCompleteColumn(),
                   console=out.err, transient=True, disable=out.json)
    p = d = 0
    with bar:
        if url:
            task = bar.add_task("live", total=len(reqs))
            runs["live"] = replay(url.rstrip("/"), reqs, cfg, _updater(bar, task),
                                  per_run.setdefault("live", {}))
        else:
            from mooncake_cli.conductor.local_cluster import LocalCluster, parse_local

            p, d = parse_local(local or "")
            names = _policies(policy)
            setup.check(model, names)
            for name in names:
                task = bar.add_task(name, total=len(reqs))
                cluster = LocalCluster(setup.conductor(model, name), p, d, setup.worker())
                try:
                    runs[name] = replay(cluster.url, reqs, cfg, _updater(bar, task),
                                        per_run.setdefault(name, {}))
                    if cluster.conductor is not None:
                        learned[name] = learned_model(
                            cluster.conductor.conductor.scheduler.cluster.model)
                finally:
                    cluster.close()
    report: dict[str, Any] = {"trace": trace_file, "requests": len(reqs),
                              "target": url or f"local {local} ({model}, {setup.engine})",
                              "runs": runs,
                              "setup": {"block_tokens": cfg.block_tokens,
                                        "max_input": cfg.max_input,
                                        "max_output": cfg.max_output,
                                        "min_input": min_input,
                                        "time_scale": time_scale,
                                        **({} if url else dataclasses.asdict(setup))}}
    ratios = _against_centric(runs)
    if ratios:
        report["ratios"] = ratios
    cost = sim_model(learned, runs)
    if cost is not None and PIPELINE in runs:
        # each prefill instance's cache: the store segment its blocks go to first
        cache = setup.worker().segment_size // max(1, int(cost["kv_bytes_per_token"]))
        sim = predict(reqs, cfg, cost, list(runs), p, d,
                      setup.conductor(model, PIPELINE).policy_options(), cache, cfg.seed)
        report["prediction"] = sim | {"gain": gains(runs, sim)}
    if learned:
        report["learned_cost_models"] = learned
    samples = {key: {name: got.get(key, []) for name, got in per_run.items()}
               for key in ("ttft", "tbt")}
    bench_plot.draw(out, "trace", report, plot, samples=samples)
    out.emit(report, live_table(report))
