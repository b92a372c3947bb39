"""`mooncake bench pipeline`: TTFT of one prefill instance against 2 and 3 pipeline stages."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from mooncake_cli.commands import bench_plot
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out


def _ints(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values:
        raise ConfigError(f"{flag} {text!r}: use N or N,N,...")
    return values


def _load(h: dict[str, Any], key: str) -> str:
    return "-" if h[key] is None else "/".join(f"{x:.1f}" for x in h[key])


def _human(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        h = rep["host"]
        t = Table(title=f"bench pipeline: {rep['model'].split(':')[0]}, {rep['layers']} "
                        f"layers, {rep['threads']} thread(s) per instance, chunks of "
                        f"{rep['chunk_tokens']} tokens", title_justify="left",
                  box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False,
                  caption_justify="left",
                  caption="tok: prompt tokens; st: stages; TTFT: wall time of POST "
                          "/v1/prefill, mean of each sample; ÷1: over 1 stage's; ideal: the "
                          "largest stage's share of the layers; s/lay: TTFT / the largest "
                          "stage's layers (µs/l·t: also per token); hand(off), drain: the "
                          "lead's report, s; cores: worker CPU s / wall s; same: first token "
                          "as 1 stage's")
        for col in ("tok", "st", "TTFT s", "each", "÷1", "ideal", "s/lay", "µs/l·t", "hand",
                    "drain", "cores", "same"):
            t.add_column(col, justify="right", no_wrap=True)
        for r in rep["rows"]:
            t.add_row(str(r["tokens"]), str(r["stages"]), f"{r['ttft_s']:.2f}",
                      "\n".join(f"{x:.2f}" for x in r["ttft_samples_s"]),
                      "-" if r["ratio"] is None else f"{r['ratio']:.2f}",
                      f"{r['ideal_ratio']:.2f}", f"{r['stage_s_per_layer']:.3f}",
                      f"{r['stage_us_per_layer_token']:.0f}", f"{r['handoff_s']:.2f}",
                      f"{r['drain_s']:.2f}", f"{r['busy_cores']:.2f}",
                      "yes" if r["same_first_token"] else "NO")
        con.print(t)
        con.print(f"host: {h['cores']} cores, load average {_load(h, 'load_before')} before, "
                  f"{_load(h, 'load_after')} after; prompts: {rep['prompt_source']} "
                  f"({rep['corpus_tokens']} tokens); warm-up {rep['warmup_s']:.1f} s, "
                  f"{rep['elapsed_s']:.0f} s in all")
        for r in rep["rows"]:
            for why in r["fallbacks"]:
                con.print(f"[red]{r['tokens']} tokens, {r['stages']} stages ran alone:[/red] "
                          f"{escape(why)}")
            for line in r["worker_warnings"]:
                con.print(f"[yellow]{r['tokens']} tokens, {r['stages']} stages:[/yellow] "
                          f"{escape(line)}", soft_wrap=True)
        if not rep["ok"]:
            con.print("[red]check failed:[/red] a pipelined answer fell back, gave another "
                      "first token than the single instance, or split the layers unevenly")
    return draw


def pipeline(
    ctx: typer.Context,
    model: str = typer.Option("smollm2-135m", "--model", metavar="NAME|FILE|DIR",
                              help="Model of every instance."),
    tokens: str = typer.Option("2048,4096,8190", "--tokens", metavar="N[,N...]",
                               help="Prompt lengths (8190 is \"8k\": a prompt must be shorter "
                                    "than smollm2-135m's 8192 positions)."),
    stages: str = typer.Option("1,2,3", "--stages", metavar="N[,N...]",
                               help="Stage counts; 1 (the single instance) must be among them."),
    repeat: int = typer.Option(2, "--repeat", min=1, metavar="N",
                               help="Samples of each (prompt length, stage count)."),
    chunk: int = typer.Option(512, "--chunk", min=1, metavar="TOKENS",
                              help="Tokens per pipeline chunk (and the workers' "
                                   "--chunk-size)."),
    threads: int = typer.Option(1, "--threads", min=1, metavar="N",
                                help="Torch threads of every instance."),
    timeout: float = typer.Option(1800.0, "--timeout", min=1.0,
                                  help="Seconds one prefill may take."),
    plot: str = bench_plot.option("TTFT and stage time per layer by prompt length, one bar "
                                  "per stage count, each sample a dot"),
) -> None:
    """Time to first token of 1 prefill instance against 2 and 3 pipeline stages (separate
    `mooncake prefill` processes with the same threads), and the stage time per layer."""
    from mooncake_cli.bench.pipeline import PipelineBenchConfig, run

    out: Out = ctx.obj
    cfg = PipelineBenchConfig(model, _ints("--tokens", tokens), _ints("--stages", stages),
                              repeat, chunk, threads, timeout=timeout)
    bench_plot.check(plot)
    bar = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=out.err, transient=True, disable=out.json)
    with bar:
        task = bar.add_task("starting workers", total=cfg.units())
        rep = run(cfg, lambda what: bar.update(task, advance=1, description=what))
    bench_plot.draw(out, "pipeline", rep, plot)
    out.emit(rep, _human(rep))
