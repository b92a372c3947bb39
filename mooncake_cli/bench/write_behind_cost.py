"""The decode write-behind's cost, for `bench chaos --serving`: one load run on decode workers
without write-behind and the same on ones with it, compared two ways.

- decode tokens/s seen by the client (serving_streams.throughput): what a user gets, but on a
  shared machine it moves with everything else running there;
- tokens per CPU second of the whole cluster (every process's user + system time over the run):
  the work write-behind adds (block copies, puts, the store's side of them), which other load
  on the machine changes far less.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mooncake_cli.bench.serving_procs import ServingCluster
from mooncake_cli.bench.serving_streams import Stream, throughput

STORED = "mooncake_worker_write_behind_blocks_total"
DROPPED = "mooncake_worker_write_behind_dropped_blocks_total"


def measure(cluster: ServingCluster, load: Callable[[], list[Stream]]
            ) -> tuple[list[Stream], dict[str, Any]]:
    """Run `load` on the cluster as it is; its streams and figures."""
    cpu0, m0 = cluster.cpu(), cluster.decode_metrics()
    streams = load()
    cpu1, m1 = cluster.cpu(), cluster.decode_metrics()
    fig = throughput(streams)
    cpu = cpu1["cluster"] - cpu0["cluster"]
    return streams, fig | {
        "errors": sum(not s.ok for s in streams),
        "cluster_cpu_s": cpu, "decode_cpu_s": cpu1["decode"] - cpu0["decode"],
        "tokens_per_cpu_s": fig["tokens"] / cpu if cpu > 0 else None,
        "stored_blocks": int(m1.get(STORED, 0) - m0.get(STORED, 0)),
        "dropped_blocks": int(m1.get(DROPPED, 0) - m0.get(DROPPED, 0))}


def compare(off: tuple[list[Stream], dict[str, Any]], on: tuple[list[Stream], dict[str, Any]]
            ) -> dict[str, Any]:
    """on / off: `ratio` of decode tokens/s, `cpu_ratio` of tokens per CPU second; and the
    streams whose text is the same both ways."""
    (s_off, f_off), (s_on, f_on) = off, on

    def ratio(key: str) -> float | None:
        a, b = f_on.get(key), f_off.get(key)
        return a / b if a and b else None

    return {"off": f_off, "on": f_on,
            "same_text": sum(a.ok and a.text == b.text for a, b in zip(s_off, s_on,
                                                                         strict=True)),
            "ratio": ratio("decode_tokens_per_s"), "cpu_ratio": ratio("tokens_per_cpu_s")}
