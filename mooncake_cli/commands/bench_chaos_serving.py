"""`mooncake bench chaos --serving`: decode workers killed under concurrent greedy streams
(mooncake_cli.bench.chaos_serving); its options, its checks and its human output."""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.console import Console

from mooncake_cli.commands import bench_plot
from mooncake_cli.config import load
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out, ProgressBars

SERVING = typer.Option(False, "--serving", help="Break a serving cluster instead (processes: "
                       "a store master, the conductor, 1 prefill and --decode decode workers): "
                       "concurrent greedy streams, a decode worker killed every --kill-every "
                       "seconds; streams whose text equals a clean run's, migrations, their "
                       "added latency, blocks reused per migration, and decode tokens/s with "
                       "and without write-behind.")
MODEL = typer.Option(None, "--model", metavar="NAME|FILE|DIR", help="With --serving: the "
                     "workers' model [default: smollm2-135m].")
STREAMS = typer.Option(None, "--streams", metavar="N", help="With --serving: concurrent "
                       "streams [default: 100].")
DECODE = typer.Option(None, "--decode", metavar="N", help="With --serving: decode workers "
                      "kept running [default: 3].")
KILL_EVERY = typer.Option(None, "--kill-every", metavar="SECONDS", help="With --serving: "
                          "seconds between two kills; a kill also waits until every "
                          "replacement is up [default: 10].")
MAX_TOKENS = typer.Option(None, "--max-tokens", metavar="N", help="With --serving: tokens "
                          "each stream generates [default: 64].")


def only_with_serving(**flags: Any) -> None:
    """Refuse --serving's options in the store's chaos bench."""
    given = [k for k, v in flags.items() if v is not None]
    if given:
        raise ConfigError(f"--{given[0].replace('_', '-')} needs --serving")


def _fmt(v: float | None, unit: str = " s") -> str:
    return "-" if v is None else f"{v:.2f}{unit}"


def _human(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        cfg, ch, wb = rep["config"], rep["chaos"], rep["write_behind"]
        lat, per = ch["added_latency"], ch["reused_blocks_per_migration"]
        whole = ch["identical"] == ch["streams"]
        at = ", ".join(f"{k['at_s']:g}" for k in ch["kills"]) or "-"
        con.print(f"[bold]bench chaos --serving[/bold]: {cfg['streams']} greedy streams of "
                  f"{cfg['max_tokens']} tokens ({rep['model']}), {cfg['decode']} decode "
                  f"workers, {len(ch['kills'])} killed with SIGKILL (at {at} s)")
        con.print(f"  [{'green' if whole else 'red'}]{ch['identical']}/{ch['streams']} "
                  f"streams identical to the clean run[/]; {ch['errors']} failed, "
                  f"{ch['differs']} with other text")
        con.print(f"  migrations {ch['migrations']} ({ch['moved_streams']} streams moved); "
                  f"added latency p50 {_fmt(lat['p50_s'])}, p99 {_fmt(lat['p99_s'])} "
                  f"(largest token gap minus the clean run's); conductor's migration gap "
                  f"mean {_fmt(ch['conductor_migration_gap']['mean_s'])}; a moved answer "
                  f"waited {_fmt(ch['migration_placement']['queue_wait_p50_s'])} (p50) in "
                  f"the conductor's queue")
        con.print(f"  blocks per migration: reused {_fmt(per, '')}, recomputed "
                  f"{_fmt(ch['recomputed_blocks_per_migration'], '')}")
        on, off = wb["on"], wb["off"]
        con.print(f"  write-behind: decode {on['decode_tokens_per_s']:.1f} tokens/s on, "
                  f"{off['decode_tokens_per_s']:.1f} off: ratio {_fmt(wb['ratio'], '')}; "
                  f"tokens per CPU second of the cluster: ratio {_fmt(wb['cpu_ratio'], '')} "
                  f"({on['stored_blocks']} blocks stored, {on['dropped_blocks']} dropped; "
                  f"{on['runs']} runs each way)")
        for e in (ch["failures"] + rep["clean"]["failures"])[:5]:
            con.print(f"  [red]failed:[/red] {e}")
        if ch["conductor_errors"]:
            con.print("  the conductor logged:", markup=False)
            for line in ch["conductor_errors"][-10:]:
                con.print(f"    {line}", markup=False, highlight=False)
    return draw


def serving(out: Out, model: str | None, streams: int | None, decode: int | None,
            kill_every: float | None, max_tokens: int | None, seed: int | None,
            **store_flags: Any) -> None:
    """Run the serving chaos bench; `store_flags` (the store bench's options) must be unset."""
    from mooncake_cli.bench.chaos_serving import ServingChaosConfig, run

    plot = store_flags.pop("plot", None)
    given = [k for k, v in store_flags.items() if v]
    if given:
        raise ConfigError(f"--{given[0].replace('_', '-')} does not apply to --serving")
    cfg = load(ServingChaosConfig, "bench_chaos_serving", out.config_file, model=model,
               streams=streams, decode=decode, kill_every=kill_every, max_tokens=max_tokens,
               seed=seed)
    bench_plot.check(plot)
    if out.err.is_terminal:
        bars = ProgressBars(out.err)
        with bars.bar:
            rep = run(cfg, bars)
    else:
        rep = run(cfg, _Lines(out.err))
    bench_plot.draw(out, "chaos-serving", rep, plot)
    out.emit(rep, _human(rep))


class _Lines:
    """Progress as plain lines on stderr (not a terminal): each phase's start and end."""

    def __init__(self, err: Console) -> None:
        self.err = err
        self.t0 = time.monotonic()

    def __call__(self, phase: str, done: int, total: int) -> None:
        if done in (0, total):
            state = "started" if done == 0 else "done"
            self.err.print(f"{time.monotonic() - self.t0:7.1f} s  {phase}: {state}",
                           highlight=False)
