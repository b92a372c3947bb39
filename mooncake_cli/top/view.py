"""How `mooncake top` draws a ClusterSnapshot with rich: a header line, the four figures, the
instances, the links KV moved along, and SLO attainment with preemptions."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich import box
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mooncake_cli.config import human_size
from mooncake_cli.top.histogram import LatencySlo
from mooncake_cli.top.snapshot import ClusterSnapshot

DASH = "-"


def pct(v: float | None) -> str:
    return DASH if v is None else f"{100 * v:.1f}%"


def size(v: float | None) -> str:
    return DASH if v is None else human_size(v)


def count(v: float | None) -> str:
    return DASH if v is None else f"{v:,.0f}"


def secs(v: float | None) -> str:
    if v is None:
        return DASH
    return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"


def _table(title: str, columns: Sequence[str]) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold", expand=False,
              box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    return t


def header(snap: ClusterSnapshot, note: str = "") -> Text:
    alive = sum(1 for i in snap.instances if i.alive)
    q, at = snap.queue, time.strftime("%H:%M:%S", time.localtime(snap.at))
    text = (f"mooncake top  {snap.conductor}  policy {snap.policy or DASH}  "
            f"{alive}/{len(snap.instances)} instances alive  queue "
            f"{count(q.get('length'))}/{count(q.get('limit'))} (oldest "
            f"{secs(q.get('oldest_wait_s'))})  at {at}")
    return Text(text + (f"  {note}" if note else ""), style="bold")


def figures(snap: ClusterSnapshot) -> Table:
    f = snap.figures
    cache, ev, moved = f.cache_size, f.evictions, f.bytes_moved
    t = _table("The four figures", ["figure", "value"])
    kv = f"KV {size(cache['kv_used_bytes'])} of {size(cache['kv_capacity_bytes'])} in use"
    if cache["store_capacity_bytes"] is not None:
        kv += f", store {size(cache['store_bytes_used'])} of " \
              f"{size(cache['store_capacity_bytes'])}"
    evicted = f"index {count(ev['index'])}, workers {count(ev['workers'])}"
    if ev["store"] is not None:
        evicted += f", store {count(ev['store'])}"
    rate = moved["rate_per_s"]
    paths = ", ".join(f"{p} {size(v)}" for p, v in sorted(moved["by_path"].items()))
    t.add_row("prefix-cache hit ratio", pct(f.prefix_hit_ratio))
    t.add_row("cache size", f"{count(cache['indexed_blocks'])} blocks indexed; {kv}")
    t.add_row("evictions", evicted)
    t.add_row("bytes moved", size(moved["total"]) + (f" ({paths})" if paths else "")
              + (f", {size(rate)}/s" if rate is not None else ""))
    return t


def instances(snap: ClusterSnapshot) -> Table:
    t = _table("Instances", ["name", "role", "state", "run/wait", "KV used", "cached",
                             "preempted now/all", "hit ratio", "step"])
    for column in t.columns[:3]:
        column.no_wrap = True
    for i in snap.instances:
        state = "alive" if i.alive else f"dead ({i.dead_reason or 'silent'})"
        if i.metrics_error:
            state += ", no /metrics"
        kv = DASH if i.kv_used_ratio is None else \
            f"{pct(i.kv_used_ratio)} of {count(i.kv_total_blocks)}"
        t.add_row(escape(i.name), i.role, state, f"{count(i.running)}/{count(i.waiting)}", kv,
                  count(i.cached_blocks), f"{count(i.preempted)}/{count(i.preemptions)}",
                  pct(i.hit_ratio), secs(i.step_s or None))
    return t


def links(snap: ClusterSnapshot) -> Table:
    t = _table("KV bytes moved per link", ["from", "to", "bytes", "rate"])
    for link in snap.links:
        rate = DASH if link.rate_per_s is None else f"{size(link.rate_per_s)}/s"
        t.add_row(escape(link.source), escape(link.target), size(link.bytes), rate)
    return t


def _latency(lat: LatencySlo) -> str:
    text = f"mean {secs(lat.mean_s)}, p99 under {secs(lat.p99_under_s)}"
    if lat.slo_s is not None:
        within = DASH if lat.bound_s is None else \
            f"{pct(lat.attained_ratio)} within {secs(lat.bound_s)}"
        text += f"; SLO {secs(lat.slo_s)}: {within}"
    return text


def slo(snap: ClusterSnapshot) -> Table:
    s, p = snap.slo, snap.preemptions
    t = _table("SLO attainment and preemptions", ["figure", "value"])
    t.add_row("requests", f"{count(s.requests)} ({count(s.errors)} failed)")
    t.add_row("admitted", f"{pct(s.admitted_ratio)} ({count(s.rejected)} refused for the "
                          f"SLO, {count(s.queue_full)} for a full queue)")
    t.add_row("TTFT", _latency(s.ttft))
    t.add_row("TBT", _latency(s.tbt))
    t.add_row("preemptions", f"{count(p['total'])} since start, {count(p['now'])} "
                             "preempted now")
    return t


def stores(snap: ClusterSnapshot) -> Table | None:
    if not snap.stores:
        return None
    t = _table("Store masters", ["metrics", "hit ratio", "objects", "used", "evictions"])
    for s in snap.stores:
        if s["error"]:
            t.add_row(escape(s["url"]), escape(s["error"]), "", "", "")
            continue
        t.add_row(escape(s["url"]), pct(s["hit_ratio"]), count(s["objects"]),
                  f"{size(s['bytes_used'])} of {size(s['capacity_bytes'])}",
                  count(s["evictions"]))
    return t


def render(snap: ClusterSnapshot, note: str = "") -> RenderableType:
    """The whole screen; `note` goes at the end of the header (keys, a failed refresh)."""
    parts: list[RenderableType] = [header(snap, note), figures(snap), instances(snap),
                                   links(snap), slo(snap)]
    store_table = stores(snap)
    if store_table is not None:
        parts.append(store_table)
    return Group(*parts)
