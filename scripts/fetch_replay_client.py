"""The client side of scripts/fetch_replay_testbed.py, run inside the conductor's testbed host:
a warm-up that has every ordered pair of prefill workers fetch a prefix once, then the
measured replay of a slice of the FAST'25 conversation trace. Prints one JSON line.

Warm-up, per source worker s (in name order): a unique blocker request for each worker named
before s (the conductor books each on the lowest-named idle worker), then a unique prefix X_s,
which so lands on s (the lowest-named idle one: the conductor breaks ties by name). Once all
are done, X_s + a distinct suffix per worker, all at once: the first placed runs on s, each
next one finds s and the workers before it booked and goes to the least queued other one,
which fetches X_s from s when the conductor's estimate says fetching pays (on a link it has
not measured: at the cost model's bandwidth, the prior). Each step waits until the
conductor's --explain file holds its decisions, so the blockers are booked before X_s. Last,
per s, a probe extending each of its burst's prompts: the one extending the prompt that ran on
s has its longest prefix on s alone, so its decision record (every candidate's estimate, from
s) shows the links from s as the conductor measured them.

The slice (`conversations`): the requests of the trace's first `window` seconds that belong
to a conversation with at least two requests there (same first own block, hash_ids[1]); of
those conversations, in the order they start, `count` evenly spaced (every k-th), so that
their first requests spread over the window; all their requests at their arrival times.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from mooncake_cli.bench.trace_live import Outcome, ReplayConfig, replay, send, synthesise
from mooncake_cli.sim.trace import TraceRequest, load_trace


def conversations(window: float, count: int, time_scale: float) -> list[TraceRequest]:
    """The trace slice described above, arrivals divided by `time_scale`."""
    groups: dict[int, list[TraceRequest]] = defaultdict(list)
    for r in load_trace("conversation"):
        if r.arrival >= window:
            break
        if len(r.hash_ids) > 1:
            groups[r.hash_ids[1]].append(r)
    multi = sorted((g for g in groups.values() if len(g) > 1), key=lambda g: g[0].arrival)
    step = max(1.0, len(multi) / count)  # spread over the window, not its first seconds
    picked = [multi[int(i * step)] for i in range(min(count, len(multi)))]
    chosen = sorted((r for g in picked for r in g), key=lambda r: r.arrival)
    return [replace(r, arrival=r.arrival / time_scale) for r in chosen]


class Warmup:
    """Sends the warm-up's requests and waits for each decision in the explain file."""

    def __init__(self, url: str, model: str, explain: Path, vocab: int, seed: int) -> None:
        self.url, self.model, self.explain = url, model, explain
        self.rng = random.Random(seed)
        self.vocab = vocab
        self.pool = ThreadPoolExecutor(max_workers=16)

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(1, self.vocab) for _ in range(n)]

    def decisions(self) -> list[dict[str, Any]]:
        if not self.explain.exists():
            return []
        return [json.loads(x) for x in self.explain.read_text().splitlines() if x.strip()]

    def placed(self, prompts: list[list[int]],
               timeout: float = 60.0) -> tuple[list[Future[Outcome]], list[str]]:
        """Send `prompts` at once (max_tokens 1) and return once the conductor placed them
        all: the pending answers, and the prefill instances chosen in the order placed."""
        before = len(self.decisions())
        futs = [self.pool.submit(send, self.url, self.model, p, 1, 600.0) for p in prompts]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.decisions()[before:]
            if len(got) >= len(prompts):
                return futs, [str(d["prefill"]["instance"]) for d in got]
            for f in futs:
                if f.done() and f.result().status != 200:
                    raise SystemExit(f"a warm-up request failed: {f.result().error}")
            time.sleep(0.01)
        raise SystemExit("the conductor logged no decision for a warm-up request")

    @staticmethod
    def wait(futs: list[Future[Outcome]]) -> None:
        for f in futs:
            if f.result().status != 200:
                raise SystemExit(f"a warm-up request failed: {f.result().error}")

    def run(self, names: list[str], prefix: int, blocker: int) -> dict[str, Any]:
        """The warm-up above; what landed where and which pairs fetched."""
        placed, fetched, bursts = [], [], []
        for i, s in enumerate(names):
            blockers, _ = self.placed([self.tokens(blocker) for _ in range(i)])
            x = self.tokens(prefix)
            futs, on = self.placed([x])
            self.wait(futs + blockers)  # all idle again, s holding X_s
            prompts = [x + self.tokens(16) for _ in names]
            futs, then = self.placed(prompts)  # at once: each sees the others' bookings
            self.wait(futs)
            placed.append({"source": s, "prefix_on": on[0], "then_on": then})
            bursts.append(prompts)
        for prompts in bursts:  # probes: the one extending what ran on s has its longest
            self.wait(self.placed([p + self.tokens(16) for p in prompts])[0])  # prefix on s
        for d in self.decisions():
            src = d["prefill"]["fetch_from"]
            if src:
                fetched.append([src, d["prefill"]["instance"]])
        return {"placed": placed, "fetched": fetched, "decisions": len(self.decisions())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--explain", required=True)
    ap.add_argument("--names", required=True)
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--blocker", type=int, default=256)
    ap.add_argument("--window", type=float, default=600.0)
    ap.add_argument("--conversations", type=int, default=50)
    ap.add_argument("--time-scale", type=float, default=5.0)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--max-input", type=int, default=1024)
    ap.add_argument("--max-output", type=int, default=2)
    a = ap.parse_args()
    cfg = ReplayConfig(block_tokens=a.block_tokens, max_input=a.max_input,
                       max_output=a.max_output, concurrency=128, timeout=600.0)
    from mooncake_cli.http import jsonhttp

    model = jsonhttp.call(a.url + "/v1/models").body["data"][0]["id"]
    warm = Warmup(a.url, model, Path(a.explain), cfg.vocab, seed=12345)
    t0 = time.monotonic()
    warmup = warm.run(a.names.split(","), a.prefix, a.blocker)
    warmup["seconds"] = round(time.monotonic() - t0, 1)
    reqs = conversations(a.window, a.conversations, a.time_scale)
    samples: dict[str, list[float]] = {}
    result = replay(a.url, reqs, cfg, samples=samples)
    result.pop("hit_over_time", None)
    print(json.dumps({"warmup": warmup, "replay": result, "ttft": samples.get("ttft", []),
                      "prompt_tokens": sum(len(synthesise(r, cfg)) for r in reqs),
                      "span_s": round(reqs[-1].arrival - reqs[0].arrival, 1)}))


if __name__ == "__main__":
    main()
