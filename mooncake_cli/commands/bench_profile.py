"""`mooncake bench profile`: measure prefill and decode times (this machine's engine, or a vLLM
server's), fit a cost model."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from mooncake_cli.commands import bench_plot
from mooncake_cli.config import load
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out, ProgressBars


def _human(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        doc = rep["profile"]
        t = Table(title=f"bench profile: {doc['model']}\n  on {doc['device']}; held-out points",
                  title_justify="left", box=box.SIMPLE_HEAD, caption_justify="left",
                  caption="n: input tokens, p: cached prefix tokens, ctx: context tokens in "
                          "the batch; error = |predicted - measured| / measured")
        for col in ("kind", "point", "measured ms", "predicted ms", "error"):
            t.add_column(col, justify="left" if col in ("kind", "point") else "right")
        for r in rep["held_out"]:
            t.add_row(r["kind"], r["point"], f"{r['measured_s'] * 1e3:.2f}",
                      f"{r['predicted_s'] * 1e3:.2f}", f"{r['error']:.1%}")
        con.print(t)
        f = doc["fit"]
        con.print(f"prefill(n, p) = {f['c0']:.3g} + {f['c_quad']:.3g}*(n^2-p^2) + "
                  f"{f['c_lin']:.3g}*(n-p) s")
        con.print(f"decode step(batch, ctx) = {f['d0']:.3g} + {f['d_batch']:.3g}*batch + "
                  f"{f['d_ctx']:.3g}*ctx s")
        for kind, e in rep["fit_error"].items():
            if e:
                con.print(f"fit error on held-out {kind}: mean {e['mean']:.1%}, "
                          f"max {e['max']:.1%}")
        n = doc.get("server", {}).get("cached_samples_verified_by", {})
        if sum(n.values()):
            con.print(f"cached prefixes reused, checked on {n['usage']} samples by vLLM's "
                      f"usage, {n['metrics']} by its metrics" + (
                          f"; {n['none']} not checked (start vLLM with "
                          "--enable-prompt-tokens-details)" if n["none"] else ""))
        con.print(f"wrote {rep['output']}")
    return draw


def profile(
    ctx: typer.Context,
    model: str = typer.Option(None, "--model", metavar="DIR|FILE|NAME",
                              help="Checkpoint directory (config.json, *.safetensors, "
                                   "tokenizer.json), .gguf file, named model, or a demo: "
                                   "demo, demo-25m (random weights) [default: demo]."),
    device: str = typer.Option(None, "--device", help="cpu, cuda or cuda:N [default: cpu]."),
    dtype: str = typer.Option(None, "--dtype", help="float32, bfloat16 or float16 "
                              "[default: float32]."),
    block_size: int = typer.Option(None, "--block-size", help="Tokens per KV block "
                                   "[default: 16]."),
    chunk_size: int = typer.Option(None, "--chunk-size", help="Tokens per prefill step "
                                   "[default: 512]."),
    lengths: str = typer.Option(None, "--lengths", help="Prefill input lengths to fit on "
                                "[default: 128,256,512,1024,2048]."),
    cached: str = typer.Option(None, "--cached", help="Cached-prefix fractions of each "
                               "length [default: 0,0.5,0.9]."),
    batches: str = typer.Option(None, "--batches", help="Decode batch sizes "
                                "[default: 1,2,4,8,16,32]."),
    contexts: str = typer.Option(None, "--contexts", help="Decode context tokens per "
                                 "sequence [default: 128,512]."),
    repeats: int = typer.Option(None, "--repeats", help="Timed rounds per point, fastest kept "
                                "[default: 3]."),
    threads: int = typer.Option(None, "--threads", help="Torch threads (1 gives steadier "
                                "times on a busy machine) [default: torch's choice]."),
    bandwidth: str = typer.Option(None, "--bandwidth", help="KV transfer bytes/s between "
                                  "instances to record, e.g. from `bench transfer` "
                                  "[default: 10GB]."),
    output: str = typer.Option(None, "--output", "-o", help="Profile file to write "
                               "[default: profile.json]."),
    plot: str = bench_plot.option("measured against predicted times, fitted and held-out "
                                  "points"),
    url: str = typer.Option(None, "--url", metavar="http://HOST:PORT",
                            help="Profile this running vLLM (OpenAI-compatible) server instead "
                                 "of our engine; its model, block size and KV size come from "
                                 "the server [default: none]."),
    kv_bytes_per_token: int = typer.Option(None, "--kv-bytes-per-token", metavar="BYTES",
                                           help="With --url: KV bytes one token takes on the "
                                                "server [default: read from the server]."),
) -> None:
    """Time prefill over (input length, cached prefix) and decode steps over batch size with
    the real engine, or with a running vLLM server (--url), fit the conductor's cost model,
    write profile.json and print the fit error on held-out points (between the fitted ones)."""
    out: Out = ctx.obj
    from mooncake_cli.bench.profile_fit import run_profile
    from mooncake_cli.bench.profile_grid import ProfileConfig

    cfg = load(ProfileConfig, "bench_profile", out.config_file, model=model, device=device,
               dtype=dtype, block_size=block_size, chunk_size=chunk_size, lengths=lengths,
               cached=cached, batches=batches, contexts=contexts, repeats=repeats,
               threads=threads, bandwidth=bandwidth, output=output, url=url,
               kv_bytes_per_token=kv_bytes_per_token)
    bench_plot.check(plot)
    engine_only = {"--model": model, "--device": device, "--dtype": dtype,
                   "--chunk-size": chunk_size, "--threads": threads}
    if cfg.url and (given := [k for k, v in engine_only.items() if v is not None]):
        raise ConfigError(f"{', '.join(given)}: our engine's, not with --url (the server "
                          "runs its own model)")

    def run(progress: Any = None) -> dict[str, Any]:
        if not cfg.url:
            return run_profile(cfg, progress)
        from mooncake_cli.bench.profile_server import run_server_profile
        return run_server_profile(cfg, block_size, progress)

    if out.json:
        rep = run()
    else:
        bar = ProgressBars(out.err, width=24)
        with bar.bar:
            rep = run(bar.single)
    bench_plot.draw(out, "profile", rep, plot)
    out.emit(rep, _human(rep))
