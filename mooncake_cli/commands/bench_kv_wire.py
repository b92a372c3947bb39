"""`mooncake bench kv-wire`: int8 KV on the wire against the model's dtype, quality and size."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out


def _human(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        q, s = rep["quality"], rep["size"]
        tab = Table(title=f"bench kv-wire: {rep['model']}, {rep['dtype']}, {rep['prompts']} "
                          f"prompts, {rep['prefix_tokens']}-token shared prefixes, "
                          f"{rep['new_tokens']} tokens each", title_justify="left",
                    box=box.SIMPLE_HEAD, caption_justify="left",
                    caption=f"{rep['utc']} UTC, load average {rep['load_average']}")
        tab.add_column("figure")
        tab.add_column("value", justify="right")
        rows = [("mean KL(native || int8), nats", f"{q['mean_kl_nats']:.5f}"),
                ("p99 / max KL, nats", f"{q['p99_kl_nats']:.4f} / {q['max_kl_nats']:.4f}"),
                ("greedy agreement per step (same context)",
                 f"{q['forced_top1_agreement']:.4f}"),
                ("prompts with identical greedy output", f"{q['free_exact_prompts']:.3f}"),
                ("tokens before the first difference", f"{q['free_tokens_before_divergence']:.3f}"),
                ("bytes per block, native / int8",
                 f"{s['native_block_bytes']} / {s['int8_block_bytes']} ({s['ratio']:.3f})"),
                (f"ms per block on {s['link_gbit']:g} Gbit, native / int8",
                 f"{s['native_link_ms']:.3f} / {s['int8_link_ms']:.3f}"),
                ("ms per block to quantize / dequantize here",
                 f"{s['quantize_ms']:.3f} / {s['dequantize_ms']:.3f}"),
                ("int8 link + codec, ms per block", f"{s['int8_total_ms']:.3f}")]
        for row in rows:
            tab.add_row(*row)
        con.print(tab)
    return draw


def kv_wire(
    ctx: typer.Context,
    model: str = typer.Option("smollm2-135m", "--model", metavar="NAME|FILE|DIR",
                              help="A named model, .gguf file or checkpoint directory."),
    dtype: str = typer.Option("bfloat16", "--dtype",
                              help="The KV dtype int8 is compared against: float32, bfloat16 "
                                   "or float16."),
    threads: int = typer.Option(2, "--threads", min=1, help="torch threads."),
    prefixes: int = typer.Option(5, "--prefixes", metavar="N", min=1, max=8,
                                 help="Shared prefixes (documents of this package)."),
    suffixes: int = typer.Option(10, "--suffixes", metavar="N", min=1, max=10,
                                 help="Prompts per prefix (different questions after it)."),
    prefix_tokens: int = typer.Option(1024, "--prefix-tokens", metavar="N", min=16,
                                      help="Tokens of each prefix (whole blocks)."),
    new_tokens: int = typer.Option(32, "--new-tokens", metavar="N", min=1,
                                   help="Greedy tokens generated per prompt."),
    link_gbit: float = typer.Option(1.0, "--link-gbit", metavar="GBIT", min=0.001,
                                    help="Link rate of the transfer-time figures."),
) -> None:
    """Mean KL and greedy agreement of int8 KV against the model's dtype; bytes and link time."""
    from mooncake_cli.bench.kv_wire import KVWireBenchConfig, run

    out: Out = ctx.obj
    cfg = KVWireBenchConfig(model, dtype, threads, prefixes, suffixes, prefix_tokens,
                            new_tokens, link_gbit=link_gbit)
    try:
        rep = run(cfg, lambda msg: out.err.print(msg) if not out.json else None)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    out.emit(rep, _human(rep))
