"""`--plot FILE.png` of every `mooncake bench` command: the option, the check before a run and
the drawing after it, from the same dict the command prints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from mooncake_cli.bench import plot_pipeline, plot_scheduler, plot_serving, plot_storage, plots
from mooncake_cli.output import Out

FIGURES: dict[str, Callable[..., Any]] = {
    "transfer": plot_storage.transfer, "store": plot_storage.store, "chaos": plot_storage.chaos,
    "store-policy": plot_storage.store_policy, "trace": plot_serving.trace,
    "burst": plot_serving.burst, "model": plot_serving.model, "workers": plot_serving.workers,
    "profile": plot_serving.profile, "scheduler": plot_scheduler.scheduler,
    "chaos-serving": plot_serving.chaos_serving, "pipeline": plot_pipeline.pipeline,
}


def option(what: str) -> Any:
    """The --plot option of a bench command that draws `what`."""
    return typer.Option(None, "--plot", metavar="FILE.png",
                        help=f"Also draw {what} to this PNG (needs matplotlib: "
                             f"{plots.PLOT_EXTRA}).")


def check(path: str | None) -> None:
    """Before the run: one error line if the plot could not be written afterwards."""
    if path:
        plots.check_path(path)


def draw(out: Out, kind: str, data: dict[str, Any], path: str | None, **extra: Any) -> None:
    """Draw `data` (the command's --json dict) as the `kind` figure to `path`, if given, and
    record the file under data["plot"]."""
    if not path:
        return
    plots.save(FIGURES[kind](data, **extra), path)
    data["plot"] = path
    if not out.json:
        out.err.print(f"wrote {path}")
