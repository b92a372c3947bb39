"""`mooncake bench model`: our engine against transformers' generate, same weights and threads."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from mooncake_cli.commands import bench_plot
from mooncake_cli.output import Out


def _human(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        o, t, r, ld = rep["ours"], rep["transformers"], rep["ratios"], rep["load"]
        tab = Table(title=f"bench model: {rep['description']}, {rep['dtype']}, "
                          f"{rep['threads']} thread(s)", title_justify="left",
                    box=box.SIMPLE_HEAD, caption_justify="left",
                    caption=f"decode tok/s exclude prefill; limit = memcpy "
                            f"{rep['memcpy_gbps']:.1f} GB/s ÷ {rep['weight_bytes'] / 1e6:.0f} MB "
                            "of weights per token")
        for col in ("figure", "ours", "transformers", "ours÷transformers"):
            tab.add_column(col, justify="left" if col == "figure" else "right")
        tab.add_row("single-stream decode, tok/s", f"{o['single_tok_s']:.1f}",
                    f"{t['single_tok_s']:.1f}", f"{r['single']:.2f}")
        tab.add_row("  bandwidth limit, tok/s", f"{rep['bandwidth_limit_tok_s']:.1f}", "",
                    f"ours {r['single_of_limit']:.2f} of it")
        tab.add_row(f"{rep['concurrency']} concurrent, aggregate tok/s",
                    f"{o['batch_tok_s']:.1f}", f"{t['batch_tok_s']:.1f}", f"{r['batch']:.2f}")
        mixed = rep["mixed_tokens"]
        tab.add_row(f"  ... asking {min(mixed)}-{max(mixed)} tokens each",
                    f"{o['mixed_tok_s']:.1f}", f"{t['mixed_tok_s']:.1f}", f"{r['mixed']:.2f}")
        tab.add_row(f"TTFT, {rep['prompt_tokens']}-token prompt, s", f"{o['ttft_s']:.3f}",
                    f"{t['ttft_s']:.3f}", f"{r['ttft']:.2f}")
        tab.add_row("peak RSS while loading ÷ weights", f"{ld['peak_ratio']:.2f}", "",
                    f"growth {ld['growth_ratio']:.2f}")
        con.print(tab)
    return draw


def model(
    ctx: typer.Context,
    model: str = typer.Option("smollm2-135m", "--model", metavar="NAME|FILE|DIR",
                              help="A named model, .gguf file or checkpoint directory."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16."),
    threads: int = typer.Option(2, "--threads", min=1, help="torch threads for both engines."),
    tokens: int = typer.Option(64, "--tokens", min=2, help="Tokens generated per request."),
    concurrency: int = typer.Option(16, "--concurrency", min=1,
                                    help="Requests decoded together."),
    prompt_tokens: int = typer.Option(2048, "--prompt-tokens", min=16,
                                      help="Prompt length of the TTFT figure."),
    repeats: int = typer.Option(2, "--repeats", min=1, help="Best of this many runs per row."),
    plot: str = bench_plot.option("decode tokens/s and TTFT, ours beside transformers"),
) -> None:
    """Decode tokens/s (1 and N streams), TTFT and load memory: ours vs transformers."""
    from mooncake_cli.bench.model import ModelBenchConfig, run

    out: Out = ctx.obj
    cfg = ModelBenchConfig(model, dtype, threads, tokens, concurrency, prompt_tokens, repeats)
    bench_plot.check(plot)
    rep = run(cfg, lambda msg: out.err.print(msg) if not out.json else None)
    bench_plot.draw(out, "model", rep, plot)
    out.emit(rep, _human(rep))
