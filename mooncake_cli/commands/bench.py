"""`mooncake bench`: measure each layer against its peer or physical limit."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, help="Benchmarks, reported side by side with ratios.")
