"""`mooncake bench prefix-reuse` and `mooncake bench conductor-cpu`: the roles as processes of
their own (a store master, workers on an engine, conductors), measured from outside."""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from mooncake_cli.bench.role_procs import RoleSpec
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out
from mooncake_cli.worker.engines import worker_class

MODEL = typer.Option("smollm2-135m", "--model", metavar="NAME|FILE|DIR",
                     help="Model of every worker.")
BLOCK = typer.Option(16, "--block-size", metavar="TOKENS", help="Tokens per KV block of the "
                     "workers and conductors (vLLM on a CPU: a multiple of 32).")
KV_BLOCKS = typer.Option(512, "--kv-blocks", metavar="N", help="KV blocks per worker.")


def _roles(model: str, engine: str, block_size: int, kv_blocks: int) -> RoleSpec:
    """The spec, once `engine` is known to be installed here (PluginError before any start)."""
    if block_size < 1 or kv_blocks < 1:
        raise ConfigError("--block-size and --kv-blocks must be >= 1")
    worker_class(engine, "prefill")
    return RoleSpec(model=model, engine=engine, block_size=block_size, kv_blocks=kv_blocks)


def _host(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`run()`'s report with the UTC start time and the load average before and after."""
    start = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    before = [round(x, 2) for x in os.getloadavg()]
    got = run()
    return {**got, "host": {"start": start, "cores": os.cpu_count(),
                                   "load_before": before,
                                   "load_after": [round(x, 2) for x in os.getloadavg()]}}


def _table(title: str, caption: str, cols: list[str]) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, caption=caption,
              caption_justify="left")
    for c in cols:
        t.add_column(c, justify="right", no_wrap=True)
    return t


def _reuse_view(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        s, h = rep["setup"], rep["host"]
        t = _table(f"bench prefix-reuse: {s['model']} on {s['engine']}, a {s['prefix_tokens']}"
                   f"-token prefix + {s['suffix_tokens']} tokens, blocks of {s['block_size']}",
                   "TTFT through the conductor, s; store: the prefix another prefill worker "
                   "computed, from the store; recompute: a fresh prefix; cached: tokens the "
                   "prefill worker reported reused", ["#", "first", "store", "cached",
                                                      "recompute", "cached", "store÷recompute"])
        for r in rep["rows"]:
            t.add_row(str(r["repeat"]), f"{r['first_ttft_s']:.3f}", f"{r['store_ttft_s']:.3f}",
                      str(r["store_cached_tokens"]), f"{r['recompute_ttft_s']:.3f}",
                      str(r["recompute_cached_tokens"]), f"{r['ratio']:.3f}")
        con.print(t)
        con.print(f"mean TTFT store {rep['store_ttft_s']['mean']:.3f} s, recompute "
                  f"{rep['recompute_ttft_s']['mean']:.3f} s: store÷recompute "
                  f"{rep['ratio_of_means']:.3f} ({rep['speedup_of_means']:.2f}x faster)")
        _host_line(con, h)
    return draw


def _host_line(con: Console, h: dict[str, Any]) -> None:
    con.print(f"{h['start']}, {h['cores']} cores, load average {h['load_before']} before, "
              f"{h['load_after']} after")


def prefix_reuse(
    ctx: typer.Context,
    model: str = MODEL,
    block_size: int = typer.Option(128, "--block-size", metavar="TOKENS", help="Tokens per "
                                   "KV block of the workers and conductors (vLLM on a CPU: a "
                                   "multiple of 32)."),
    kv_blocks: int = KV_BLOCKS,
    prefix: int = typer.Option(2048, "--prefix", metavar="TOKENS", help="Shared prefix."),
    suffix: int = typer.Option(64, "--suffix", metavar="TOKENS", help="Tokens after it."),
    repeats: int = typer.Option(3, "--repeats", metavar="N", help="Prefixes measured."),
    vocab: int = typer.Option(256, "--vocab", help="Token ids lie in [1, vocab)."),
) -> None:
    """TTFT of a prompt whose prefix another prefill worker computed (loaded from the store)
    against a fresh prefix of the same length (recomputed), on one cluster of processes with
    workers on vLLM (its MooncakeStoreConnector looks every prompt up in the store itself; a
    native worker loads only the blocks its conductor placed or chose to fetch)."""
    from mooncake_cli.bench.prefix_reuse import ReuseSpec, measure

    out: Out = ctx.obj
    spec = ReuseSpec(_roles(model, "vllm", block_size, kv_blocks), prefix=prefix,
                     suffix=suffix, repeats=repeats, vocab=vocab)
    with out.err.status("prefix-reuse: starting the workers, then measuring",
                        spinner="dots") if not out.json else nullcontext():
        rep = _host(lambda: measure(spec))
    out.emit(rep, _reuse_view(rep))


def _cpu_view(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        s, h = rep["setup"], rep["host"]
        t = _table(f"bench conductor-cpu: {s['requests']} requests of {s['prompt_tokens']} "
                   f"tokens (+{s['max_tokens']} out), {s['prefill']} prefill + {s['decode']} "
                   f"decode workers, {s['concurrency']} at a time",
                   "CPU: the conductor process's user + system time; ms/req less idle: less "
                   "its idle rate over the wall time", ["engine", "served", "wall s", "CPU s",
                                                        "ms/req", "idle CPU/s",
                                                        "ms/req less idle", "TTFT s"])
        for name, r in rep["runs"].items():
            t.add_row(name, str(r["served"]), f"{r['wall_s']:.1f}",
                      f"{r['conductor_cpu_s']:.2f}", f"{r['cpu_ms_per_request']:.2f}",
                      f"{r['idle_cpu_per_s']:.4f}", f"{r['cpu_ms_per_request_less_idle']:.2f}",
                      "-" if r["ttft_s"]["mean"] is None else f"{r['ttft_s']['mean']:.3f}")
        con.print(t)
        for k, v in rep["ratios"].items():
            con.print(f"conductor CPU per request {k}: {v:.3f}")
        _host_line(con, h)
    return draw


def conductor_cpu(
    ctx: typer.Context,
    model: str = MODEL,
    engine: str = typer.Option("native,vllm", "--engine", metavar="ENGINE[,ENGINE...]",
                               help="Engines to run the workers on, one cluster each, in "
                                    "order; ratios are over the first's."),
    block_size: int = BLOCK,
    kv_blocks: int = KV_BLOCKS,
    prefill: int = typer.Option(1, "--prefill", metavar="N", help="Prefill workers."),
    decode: int = typer.Option(1, "--decode", metavar="N", help="Decode workers."),
    requests: int = typer.Option(100, "--requests", metavar="N", help="Requests measured."),
    prompt_tokens: int = typer.Option(256, "--prompt-tokens", metavar="TOKENS",
                                      help="Tokens of each (distinct) prompt."),
    max_tokens: int = typer.Option(16, "--max-tokens", metavar="N", help="Tokens out."),
    concurrency: int = typer.Option(4, "--concurrency", metavar="N",
                                    help="Requests in flight at once."),
    idle: float = typer.Option(5.0, "--idle", metavar="SECONDS",
                               help="Seconds the idle conductor's CPU is read over."),
) -> None:
    """The conductor's own CPU time per request (a process of its own, /proc/PID/stat), in
    front of workers on each engine, in one run."""
    from mooncake_cli.bench.conductor_cpu import CpuSpec, compare

    out: Out = ctx.obj
    engines = [e.strip() for e in engine.split(",") if e.strip()]
    if not engines or len(set(engines)) != len(engines):
        raise ConfigError(f"--engine {engine!r}: name each engine once, e.g. native,vllm")
    specs = [_roles(model, e, block_size, kv_blocks) for e in engines]
    spec = CpuSpec(specs[0], prefill=prefill, decode=decode, requests=requests,
                   prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                   concurrency=concurrency, idle_s=idle)
    with out.err.status("conductor-cpu: starting the workers, then measuring",
                        spinner="dots") if not out.json else nullcontext():
        rep = _host(lambda: compare(spec, engines))
    out.emit(rep, _cpu_view(rep))

