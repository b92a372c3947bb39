"""Fetch or recompute, live: mean TTFT of a trace replay where some prefixes live across a slow
link, bandwidth-aware against always-fetch and always-recompute (issue 43; the simulated
figure is mooncake_cli/bench/fetch_links.py). Needs root.

A 5-host testbed (prefix `mcfr`): prefill workers p1, p3 (rack A) and p2, p4 (rack B), each
on its own host (--layout grouped: p1, p2 and p3, p4); within a rack at --fast, every pair
across the racks at --slow (a direct link each), and host c at --fast to all four, running the
store master, one decode worker and the conductor. By default the racks alternate in name
order: the conductor breaks ties between equal estimates by name, so when p1 holds a prefix
and is busy the next idle worker by name is across the slow link, the one after it within
p1's rack; grouped, p1's neighbour by name is in its rack. Workers run smollm2-135m on our
engine in bfloat16, one torch thread each, their transfer engines on tcp (a same-machine peer
would otherwise be read over shared memory, past the links); each puts the blocks it computes
into its own store segment, so a prefix it holds lives on its host. Per mode, everything is
started afresh (empty store, a conductor that has measured nothing) and
scripts/fetch_replay_client.py runs in c: the warm-up (every ordered pair of workers fetches a
prefix once, where the mode fetches at all), then the measured replay of a slice of the
FAST'25 conversation trace. Modes:

- bandwidth-aware: `--policy kvcache-centric` on the links it measured (the default);
- always-fetch: kvcache-centric with `--link-bandwidth model`: every pair at the cost model's
  bandwidth (1 GB/s), so a longer prefix is fetched whenever that says it pays;
- always-recompute: `--policy cache-aware`, which never fetches.

The report: per mode the mean and p90 TTFT of the measured replay and their ratio to
bandwidth-aware's; from the conductor's --explain records, the placements where another
worker held a longer prefix than the chosen one, fetched or recomputed, that holder across
the slow link or within the rack; and the links the bandwidth-aware conductor had measured
at the end of its warm-up.

    sudo python3 scripts/fetch_replay_testbed.py --slow 20mbit [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mooncake_cli.bench.stats import Child  # noqa: E402
from mooncake_cli.testbed import bed  # noqa: E402
from mooncake_cli.testbed.state import Testbed  # noqa: E402

PREFIX = "mcfr"
WORKERS = ("p1", "p2", "p3", "p4")
LAYOUTS = {"alternate": {"p1": "A", "p2": "B", "p3": "A", "p4": "B"},  # worker -> rack
           "grouped": {"p1": "A", "p2": "A", "p3": "B", "p4": "B"}}
MODES = {"bandwidth-aware": ["--policy", "kvcache-centric"],
         "always-fetch": ["--policy", "kvcache-centric", "--link-bandwidth", "model"],
         "always-recompute": ["--policy", "cache-aware"]}
MOONCAKE = [sys.executable, "-m", "mooncake_cli", "--json"]
MODEL = ["--model", "smollm2-135m", "--dtype", "bfloat16"]


def links(fast: str, slow: str, rack: dict[str, str]) -> str:
    pairs = [(a, b) for i, a in enumerate(WORKERS) for b in WORKERS[i + 1:]]
    return ",".join([f"{a}-{b}={fast if rack[a] == rack[b] else slow}" for a, b in pairs]
                    + [f"c-{w}={fast}" for w in WORKERS])


class Roles:
    """The store master, workers and conductor of one mode, started in their hosts."""

    def __init__(self, tb: Testbed, env: dict[str, str]) -> None:
        self.tb, self.env, self.c = tb, env, tb.address("c")
        self.children: list[Child] = []

    def start(self, host: str, args: list[str], what: str, timeout: float = 300) -> None:
        argv, env = bed.exec_argv(self.tb, host, MOONCAKE + args, bind=True)
        child = Child(argv, what, {**env, **self.env})
        self.children.append(child)
        deadline = time.monotonic() + timeout
        while True:  # its JSON lines until it says it serves
            ev = child.line(max(1.0, deadline - time.monotonic()))
            if ev.get("event") in ("ready", "serving") or "address" in ev:
                return

    def up(self, mode: str, explain: Path, kv_blocks: int, extra: list[str]) -> str:
        self.start("c", ["store", "master", "--host", self.c, "--port", "50051"], "master")
        common = [*MODEL, "--threads", "1"]
        for w in WORKERS:  # one at a time: loading the model takes both cores
            self.start(w, ["prefill", *common, "--kv-blocks", str(kv_blocks), "--name", w,
                           "--listen", f"{self.tb.address(w)}:9100", "--store",
                           f"{self.c}:50051", "--segment-size", "1GiB"], f"prefill {w}")
        self.start("c", ["decode", *common, "--name", "d", "--listen", f"{self.c}:9200",
                         "--kv-blocks", "2048"], "decode")
        self.start("c", ["conductor", "start", *MODEL, *MODES[mode], *extra, "--host", self.c,
                         "--port", "8000", "--explain", str(explain), "--prefill",
                         ",".join(f"http://{self.tb.address(w)}:9100" for w in WORKERS),
                         "--decode", f"http://{self.c}:9200"], "conductor")
        return f"http://{self.c}:8000"

    def close(self) -> None:
        for child in reversed(self.children):
            child.close()


def source(record: dict[str, Any]) -> tuple[str, int]:
    """The holder of the longest prefix a decision saw (lowest name on ties, as the policy
    takes it) and its length in blocks."""
    best = min(record["candidates"], key=lambda c: (-c["local_blocks"], c["instance"]))
    return best["instance"], best["local_blocks"]


def choices(records: list[dict[str, Any]], rack: dict[str, str],
            least: int = 2) -> dict[str, int]:
    """Placements where another instance held a prefix at least `least` blocks longer than
    the chosen one: fetched or recomputed, with that holder across the slow link or within
    the rack. (Every prompt of the trace starts with the same block, which the first worker
    to store it holds alone: `least` 2 leaves out the placements that differ by it only.)"""
    out = {f"{what}_{where}": 0 for what in ("fetched", "recomputed")
           for where in ("across", "within")}
    for r in records:
        p = r["prefill"]
        src, blocks = source(r)
        if blocks - p["local_blocks"] < least:
            continue
        if p["fetch_from"]:
            src = p["fetch_from"]
        where = "within" if rack[src] == rack[p["instance"]] else "across"
        out[f"{'fetched' if p['fetch_from'] else 'recomputed'}_{where}"] += 1
    return out


def measured_links(records: list[dict[str, Any]]) -> dict[str, float]:
    """'source->dest' -> Mbit/s the conductor last estimated a fetch at in `records`, on a
    measured link."""
    seen: dict[str, float] = {}
    for r in records:
        src = source(r)[0]
        for c in r["candidates"]:
            w = c.get("fetch_or_recompute")
            if w and w["measured"]:
                seen[f"{src}->{c['instance']}"] = round(w["bandwidth"] * 8 / 1e6, 1)
    return dict(sorted(seen.items()))


def one(tb: Testbed, mode: str, a: argparse.Namespace, env: dict[str, str],
        tmp: Path) -> dict[str, Any]:
    explain = tmp / f"explain-{mode}.jsonl"
    roles = Roles(tb, env)
    try:
        url = roles.up(mode, explain, a.kv_blocks, shlex.split(a.conductor_args))
        argv, benv = bed.exec_argv(tb, "c", [
            sys.executable, str(REPO / "scripts" / "fetch_replay_client.py"), "--url", url,
            "--explain", str(explain), "--names", ",".join(WORKERS),
            "--window", str(a.window), "--conversations", str(a.conversations),
            "--time-scale", str(a.time_scale), "--block-tokens", str(a.block_tokens),
            "--max-input", str(a.max_input)])
        load0 = os.getloadavg()
        done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=3600,
                              env={**os.environ, **benv, **env})
        if done.returncode:
            raise SystemExit(f"the client failed in {mode}: {done.stderr[-3000:]}")
        got = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        roles.close()
    records = [json.loads(x) for x in explain.read_text().splitlines() if x.strip()]
    warm, rest = records[:got["warmup"]["decisions"]], records[got["warmup"]["decisions"]:]
    rep = got["replay"]
    return {"mode": mode, "mean_ttft_s": rep["ttft_s"]["mean"], "p90_ttft_s": rep["ttft_s"]["p90"],
            "p50_ttft_s": rep["ttft_s"]["p50"], "served": rep["served"],
            "requests": rep["requests"], "errors": rep["errors"],
            "first_error": rep["first_error"], "prefix_hit_ratio": rep["prefix_hit_ratio"],
            "replay_wall_s": rep["wall_s"], "warmup": {**choices(warm, LAYOUTS[a.layout]),
                                                       "seconds": got["warmup"]["seconds"],
                                                       "placed": got["warmup"]["placed"]},
            "measured": choices(rest, LAYOUTS[a.layout]), "links_mbit": measured_links(warm),
            "prompt_tokens": got["prompt_tokens"], "span_s": got["span_s"],
            "ttft_s": got["ttft"],
            "load_average_start": load0, "load_average_end": os.getloadavg()}


def report(rows: list[dict[str, Any]]) -> str:
    base = next((r for r in rows if r["mode"] == "bandwidth-aware"), rows[0])
    lines = ["| mode | mean TTFT s | p90 s | mean ÷ aware | p90 ÷ aware | fetched across "
             "| fetched within | recomputed across | recomputed within | served | load |",
             "|" + " --- |" * 11]
    for r in rows:
        m = r["measured"]
        lines.append(f"| {r['mode']} | {r['mean_ttft_s']:.3f} | {r['p90_ttft_s']:.3f} | "
                     f"{r['mean_ttft_s'] / base['mean_ttft_s']:.2f} | "
                     f"{r['p90_ttft_s'] / base['p90_ttft_s']:.2f} | {m['fetched_across']} | "
                     f"{m['fetched_within']} | {m['recomputed_across']} | "
                     f"{m['recomputed_within']} | {r['served']}/{r['requests']} | "
                     f"{r['load_average_start'][0]:.1f}-{r['load_average_end'][0]:.1f} |")
    for r in rows:
        w = r["warmup"]
        lines.append(f"warm-up of {r['mode']} ({w['seconds']} s): fetched across "
                     f"{w['fetched_across']}, within {w['fetched_within']}")
    lines.append(f"links bandwidth-aware measured in its warm-up (Mbit/s): {base['links_mbit']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description="Fetch or recompute, live on a testbed (root).")
    ap.add_argument("--slow", default="20mbit")
    ap.add_argument("--fast", default="10gbit")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--layout", choices=list(LAYOUTS), default="alternate",
                    help="racks alternating in name order, or p1, p2 and p3, p4")
    ap.add_argument("--window", type=float, default=600.0)
    ap.add_argument("--conversations", type=int, default=50)
    ap.add_argument("--time-scale", type=float, default=5.0)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--max-input", type=int, default=1024)
    ap.add_argument("--kv-blocks", type=int, default=256)
    ap.add_argument("--conductor-args", default="", help="more options for every mode's "
                    "conductor, e.g. --no-prefetch")
    ap.add_argument("--explain-dir", default="", help="keep the conductors' --explain "
                    "records there (explain-MODE.jsonl)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    env = {"MOONCAKE_SECRET": secrets.token_hex(16), "MOONCAKE_TRANSFER_TRANSPORT": "tcp",
           "PYTHONPATH": str(REPO)}  # this tree's package in every role and the client
    t0 = time.time()
    layout = links(a.fast, a.slow, LAYOUTS[a.layout])
    tb = bed.up(bed.plan(PREFIX, ",".join((*WORKERS, "c")), layout))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            keep = Path(a.explain_dir or tmp)
            keep.mkdir(parents=True, exist_ok=True)
            rows = [one(tb, m, a, env, keep) for m in a.modes.split(",")]
    finally:
        bed.down(PREFIX)
    out = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0)),
           "minutes": round((time.time() - t0) / 60, 1), "slow": a.slow, "fast": a.fast,
           "cpus": os.cpu_count(), "args": vars(a), "rows": rows}
    print(json.dumps(out, indent=1) if a.json else report(rows))


if __name__ == "__main__":
    main()
