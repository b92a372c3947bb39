"""`mooncake bench workers`: prefix-reuse TTFT and continuous-batching throughput of the workers."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from mooncake_cli.commands import bench_plot
from mooncake_cli.config import load
from mooncake_cli.output import Out


def _human(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        p, b = rep["prefix_reuse"], rep["batching"]
        t = Table(title=f"bench workers: {p['model']} ({p['parameters'] / 1e6:.1f}M parameters)",
                  title_justify="left", box=box.SIMPLE_HEAD, caption_justify="left",
                  caption="TTFT: the prefill answer (first token), median over the prompts; "
                          "tokens/s: generated tokens over decode wall time (prefill excluded), "
                          "median over the rounds")
        for col in ("figure", "row", "value", "ratio"):
            t.add_column(col, justify="right" if col in ("value", "ratio") else "left")
        cached = p["cached_blocks"] / p["blocks"]
        t.add_row(f"prefix reuse, {p['prompt_tokens']}-token prompt", "TTFT, none cached",
                  f"{p['median_cold_s']:.3f} s", "1.00")
        t.add_row("", f"TTFT, {cached:.1%} of blocks cached", f"{p['median_cached_s']:.3f} s",
                  f"{p['ratio']:.3f}")
        t.add_row(f"decode ({b['model']}), {b['requests']} requests x {b['max_tokens']} "
                  "tokens",
                  "one at a time", f"{b['tokens_per_s_alone']:.1f} tok/s", "1.00")
        t.add_row("", f"{b['requests']} together (steps: "
                      f"{', '.join(map(str, b['decode_steps_together']))})",
                  f"{b['tokens_per_s_together']:.1f} tok/s", f"{b['ratio']:.2f}")
        con.print(t)
        for name, parts in (("none cached", p["timing_cold"]),
                            ("cached", p["timing_cached"])):
            con.print(f"prefill {name}: " + ", ".join(f"{k} {v * 1e3:.0f} ms"
                                                      for k, v in parts.items()))
    return draw


def workers(
    ctx: typer.Context,
    model: str = typer.Option(None, "--model", metavar="DIR|FILE|NAME",
                              help="Checkpoint directory, .gguf file, named model or demo "
                                   "[default: demo-25m, "
                                   "big enough that compute dominates on a CPU]."),
    decode_model: str = typer.Option(None, "--decode-model", metavar="DIR|FILE|NAME",
                                     help="Model of the continuous-batching figure [default: "
                                          "demo, whose decode steps are dominated by per-step "
                                          "costs, as memory-bound GPU decode steps are]."),
    device: str = typer.Option(None, "--device", help="cpu, cuda or cuda:N [default: cpu]."),
    dtype: str = typer.Option(None, "--dtype", help="float32, bfloat16 or float16 "
                                                    "[default: float32]."),
    prompt_tokens: int = typer.Option(None, "--prompt-tokens", metavar="TOKENS",
                                      help="Prompt length of the prefix-reuse figure "
                                           "[default: 2048]."),
    cached_ratio: float = typer.Option(None, "--cached-ratio", metavar="RATIO",
                                       help="Share of the prompt's blocks already in the store "
                                            "[default: 0.9]."),
    repeats: int = typer.Option(None, "--repeats", metavar="N",
                                help="Prompts measured each way, and rounds of the "
                                     "decode figure [default: 3]."),
    concurrency: int = typer.Option(None, "--concurrency", metavar="N",
                                    help="Requests decoding together [default: 16]."),
    max_tokens: int = typer.Option(None, "--max-tokens", metavar="TOKENS",
                                   help="Tokens each decode request generates [default: 64]."),
    block_size: int = typer.Option(None, "--block-size", metavar="TOKENS",
                                    help="Tokens per KV block "
                                                              "[default: 16]."),
    plot: str = bench_plot.option("TTFT none vs most cached and decode tokens/s alone vs "
                                  "together, each measurement a dot"),
) -> None:
    """Measure TTFT with most of a prompt's KV blocks in the store against none, and decode
    throughput of concurrent requests against one at a time."""
    from mooncake_cli.bench.workers import BenchWorkersConfig, run

    out: Out = ctx.obj
    cfg = load(BenchWorkersConfig, "bench_workers", out.config_file, model=model,
               decode_model=decode_model, device=device, dtype=dtype,
               prompt_tokens=prompt_tokens,
               cached_ratio=cached_ratio, repeats=repeats, concurrency=concurrency,
               max_tokens=max_tokens, block_size=block_size)
    bench_plot.check(plot)
    bar = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                   console=out.err, transient=True, disable=out.json)
    with bar:
        task = bar.add_task("loading", total=cfg.units())
        report = run(cfg, lambda what: bar.update(task, advance=1, description=what))
    bench_plot.draw(out, "workers", report, plot)
    out.emit(report, _human(report))
