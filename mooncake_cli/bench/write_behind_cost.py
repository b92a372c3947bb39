"""The decode write-behind's cost, for `bench chaos --serving`: the same load run on decode
workers without write-behind and on ones with it, twice each in the order on, off, off, on (so
that what drifts over the run, the machine's other load or a cluster warming up, weighs on both
sides alike), compared two ways.

- decode tokens/s seen by the client (serving_streams.throughput): what a user gets, but on a
  shared machine it moves with everything else running there;
- tokens per CPU second of the whole cluster (every process's user + system time over the run):
  the work write-behind adds (block copies, puts, the store's side of them), which other load
  on the machine changes far less.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mooncake_cli.bench.serving_procs import ServingCluster
from mooncake_cli.bench.serving_streams import Stream, throughput

STORED = "mooncake_worker_write_behind_blocks_total"
DROPPED = "mooncake_worker_write_behind_dropped_blocks_total"
Run = tuple[list[Stream], dict[str, Any]]  # one load run's streams and figures
SUMMED = ("tokens", "seconds", "decode_tokens", "decode_seconds", "errors", "cluster_cpu_s",
          "decode_cpu_s", "stored_blocks", "dropped_blocks")


def measure(cluster: ServingCluster, load: Callable[[], list[Stream]]) -> Run:
    """Run `load` on the cluster as it is; its streams and figures."""
    cpu0, m0 = cluster.cpu(), cluster.decode_metrics()
    streams = load()
    cpu1, m1 = cluster.cpu(), cluster.decode_metrics()
    return streams, throughput(streams) | {
        "errors": sum(not s.ok for s in streams),
        "cluster_cpu_s": cpu1["cluster"] - cpu0["cluster"],
        "decode_cpu_s": cpu1["decode"] - cpu0["decode"],
        "stored_blocks": int(m1.get(STORED, 0) - m0.get(STORED, 0)),
        "dropped_blocks": int(m1.get(DROPPED, 0) - m0.get(DROPPED, 0))}


def side(runs: Sequence[Run]) -> dict[str, Any]:
    """The figures of one side's runs together: sums, and rates over the summed times."""
    fig: dict[str, Any] = {k: sum(f.get(k, 0) for _, f in runs) for k in SUMMED}
    fig["runs"] = len(runs)
    fig["tokens_per_s"] = fig["tokens"] / fig["seconds"] if fig["seconds"] > 0 else 0.0
    fig["decode_tokens_per_s"] = (fig["decode_tokens"] / fig["decode_seconds"]
                                  if fig["decode_seconds"] > 0 else 0.0)
    cpu = fig["cluster_cpu_s"]
    fig["tokens_per_cpu_s"] = fig["tokens"] / cpu if cpu > 0 else None
    return fig


def compare(off: Sequence[Run], on: Sequence[Run]) -> dict[str, Any]:
    """on / off: `ratio` of decode tokens/s, `cpu_ratio` of tokens per CPU second (each side's
    runs together); `same_text`: the streams of the first run of each side whose text is the
    same both ways."""
    f_off, f_on = side(off), side(on)

    def ratio(key: str) -> float | None:
        a, b = f_on.get(key), f_off.get(key)
        return a / b if a and b else None

    return {"off": f_off, "on": f_on,
            "same_text": sum(a.ok and a.text == b.text for a, b in zip(off[0][0], on[0][0],
                                                                         strict=True)),
            "ratio": ratio("decode_tokens_per_s"), "cpu_ratio": ratio("tokens_per_cpu_s")}
