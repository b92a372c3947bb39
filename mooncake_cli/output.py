"""One renderer for every command: rich tables for people, `--json` for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table


@dataclass
class Out:
    """What the root callback hands every command: global options and the consoles."""

    json: bool = False
    config_file: str | None = None
    log_level: str = "warning"
    console: Console = field(default_factory=lambda: Console(highlight=False))
    err: Console = field(default_factory=lambda: Console(stderr=True, highlight=False))

    def emit(self, data: Any, human: Callable[[Console], None] | None = None) -> None:
        """Print `data` as JSON with --json, else call `human` (or pretty-print the data)."""
        if self.json or human is None:
            sys.stdout.write(json.dumps(data, indent=None if self.json else 2, default=str)
                             + "\n")
            sys.stdout.flush()
        else:
            human(self.console)

    def event(self, data: dict[str, Any], text: str) -> None:
        """A line of progress: one JSON object per line with --json, else `text`."""
        if self.json:
            sys.stdout.write(json.dumps(data, default=str) + "\n")
            sys.stdout.flush()
        else:
            self.console.print(text, soft_wrap=True)  # one event, one line: greppable


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*(str(x) for x in r))
    return t


class ProgressBars:
    """Transient rich progress bars on `console`; `with bars.bar:` shows them while a run lasts.

    `bars(label, done, total)`: one bar per label, created on its first report. `bars.row(
    elapsed, total, label)`: the same for the benchmarks whose rows report seconds measured
    (shown with the time remaining when `timed`). `bars.single(label, done, total)`: one bar
    whose description follows the label."""

    def __init__(self, console: Console, *, width: int = 22, timed: bool = False) -> None:
        last = TimeRemainingColumn() if timed else MofNCompleteColumn()
        self.bar = Progress(TextColumn(f"{{task.description:<{width}}}"), BarColumn(), last,
                            console=console, transient=True)
        self._tasks: dict[str, TaskID] = {}

    def __call__(self, label: str, done: float, total: float) -> None:
        task = self._tasks.get(label)
        if task is None:
            task = self._tasks[label] = self.bar.add_task(label, total=total)
        self.bar.update(task, completed=done)

    def row(self, elapsed: float, total: float, label: str) -> None:
        self(label, elapsed, total)

    def single(self, label: str, done: int, total: int) -> None:
        task = self._tasks.get("")
        if task is None:
            task = self._tasks[""] = self.bar.add_task(label, total=total)
        self.bar.update(task, completed=done, description=label)
