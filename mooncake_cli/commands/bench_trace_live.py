"""`mooncake bench trace --url URL | --local P,D`: replay a trace against a live conductor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table

from mooncake_cli.bench.trace_file import load_trace
from mooncake_cli.bench.trace_live import ReplayConfig, replay
from mooncake_cli.commands import bench_plot
from mooncake_cli.conductor.config import SIMULATOR_ONLY
from mooncake_cli.conductor.scheduler import POLICIES
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out


def _f(x: Any, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _human(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        t = Table(title=f"bench trace (live): {rep['requests']} requests of {rep['trace']}, "
                        f"{rep['target']}", title_justify="left", box=box.SIMPLE_HEAD,
                  caption="TTFT/TBT in s (TBT: mean of a request's longest 10% gaps); hit: "
                          "prompt tokens the prefill workers reused", caption_justify="left")
        cols = ["policy", "TTFT", "p50", "p90", "p99", "TBT p99", "hit", "429", "errors"]
        for c in cols:
            t.add_column(c, justify="left" if c == "policy" else "right")
        for name, r in rep["runs"].items():
            tt, tb = r["ttft_s"], r["tbt_s"]
            t.add_row(name, _f(tt["mean"]), _f(tt["p50"]), _f(tt["p90"]), _f(tt["p99"]),
                      _f(tb["p99"]), f"{r['prefix_hit_ratio']:.1%}", str(r["rejected_429"]),
                      str(r["errors"]))
        con.print(t)
        for k, v in rep.get("ratios", {}).items():
            con.print(f"{k}: {v:.3f}")
    return draw


def _updater(bar: Progress, task: TaskID) -> Callable[[int, int], None]:
    return lambda done, total: bar.update(task, completed=done)


def run_live(out: Out, trace_file: str, url: str | None, local: str | None, model: str,
             policy: str | None, time_scale: float, limit: int | None, cfg: ReplayConfig,
             kv_blocks: int | None, plot: str | None = None) -> None:
    if bool(url) == bool(local):
        raise ConfigError("give either --url (a running conductor) or --local P,D")
    bench_plot.check(plot)
    per_run: dict[str, dict[str, list[float]]] = {}  # run -> {"ttft": [...], "tbt": [...]}
    reqs = load_trace(trace_file, time_scale, limit or 200)
    runs: dict[str, dict[str, Any]] = {}
    bar = Progress(TextColumn("{task.description:<18}"), BarColumn(), MofNCompleteColumn(),
                   console=out.err, transient=True, disable=out.json)
    with bar:
        if url:
            task = bar.add_task("live", total=len(reqs))
            runs["live"] = replay(url.rstrip("/"), reqs, cfg, _updater(bar, task),
                                  per_run.setdefault("live", {}))
        else:
            from mooncake_cli.conductor.config import ConductorConfig
            from mooncake_cli.conductor.local_cluster import LocalCluster, parse_local
            from mooncake_cli.worker.config import WorkerConfig

            p, d = parse_local(local or "")
            names = [x.strip() for x in (policy or "random,kvcache-centric").split(",")]
            live = [p for p in POLICIES if p not in SIMULATOR_ONLY]
            bad = [x for x in names if x not in live]
            if bad or not names:
                raise ConfigError(f"policy {', '.join(bad) or '(none)'} cannot run live: use "
                                  f"{', '.join(live)} ({', '.join(SIMULATOR_ONLY)}: --simulate "
                                  "only)")
            worker = WorkerConfig(kv_blocks=kv_blocks or 512)
            for name in names:
                task = bar.add_task(name, total=len(reqs))
                cluster = LocalCluster(ConductorConfig(port=0, model=model, policy=name),
                                       p, d, worker)
                try:
                    runs[name] = replay(cluster.url, reqs, cfg, _updater(bar, task),
                                        per_run.setdefault(name, {}))
                finally:
                    cluster.close()
    report: dict[str, Any] = {"trace": trace_file, "requests": len(reqs),
                              "target": url or f"local {local} ({model})", "runs": runs,
                              "setup": {"block_tokens": cfg.block_tokens,
                                        "max_input": cfg.max_input,
                                        "max_output": cfg.max_output,
                                        "time_scale": time_scale}}
    if "random" in runs and "kvcache-centric" in runs:
        a, b = runs["random"], runs["kvcache-centric"]
        if a["ttft_s"]["mean"] and b["ttft_s"]["mean"]:
            report["ratios"] = {"mean TTFT random/kvcache-centric":
                                a["ttft_s"]["mean"] / b["ttft_s"]["mean"],
                                "hit ratio kvcache-centric - random":
                                b["prefix_hit_ratio"] - a["prefix_hit_ratio"]}
    samples = {key: {name: got.get(key, []) for name, got in per_run.items()}
               for key in ("ttft", "tbt")}
    bench_plot.draw(out, "trace", report, plot, samples=samples)
    out.emit(report, _human(report))
