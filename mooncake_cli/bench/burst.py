"""`mooncake bench burst`: a burst of ordinary chat requests (no max_tokens, as most clients send)
against a conductor — started here as `conductor start --local` in a child process, or one at
`--url` — with every request's outcome counted: answered, 429, 503, failed.

Each request streams (TTFT is the first chunk's arrival) and reads the conductor's
`X-Mooncake-Predicted-TTFT` and `X-Mooncake-Queue-Wait` headers, so a run with an SLO reports
how many admitted requests met it and how far the predictions were from what happened. Runs at
several `--kv-blocks` sizes give the throughput of a cache small enough to preempt as a fraction
of a roomy one, with the decode workers' parked, reloaded and recomputed counts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import multiprocessing
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from mooncake_cli.bench.stats import Child

TOPICS = ["the moon", "caches", "rivers", "bread", "prime numbers", "the ocean", "chess",
          "volcanoes", "bicycles", "tea", "the alphabet", "rain", "trains", "owls", "glass"]
DECODE_COUNTERS = ("preemptions", "parked_blocks", "reloaded_blocks", "recomputed_tokens")


@dataclass(frozen=True)
class BurstConfig:
    url: str = ""  # a running conductor; none: start `conductor start --local` here
    local: str = "1,1"
    model: str = "demo"
    requests: int = 1000
    max_tokens: int | None = None  # None: the request sets none
    ttft_slo: float = 0.0
    kv_blocks: tuple[int, ...] = (512,)
    threads: int = 0  # torch threads of the local cluster's process (0: torch's default)
    api_key: str = ""
    timeout: float = 900.0
    warmup: int = 8  # sequential short requests first, so the cost model has seen the workers
    clients: int = 4  # load-generating processes


@dataclass
class Outcome:
    status: int
    seconds: float = 0.0
    ttft: float | None = None
    tokens: int = 0
    predicted_ttft: float | None = None
    waited: float | None = None
    retry_after: str | None = None
    error: str = ""


def prompt(i: int) -> str:
    return f"Tell me something about {TOPICS[i % len(TOPICS)]} (question {i})."


def _auth(cfg: BurstConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


def _header(r: httpx.Response, name: str) -> float | None:
    v = r.headers.get(name)
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


async def _one(client: httpx.AsyncClient, cfg: BurstConfig, url: str, model: str,
               i: int) -> Outcome:
    body: dict[str, Any] = {"model": model, "stream": True,
                            "stream_options": {"include_usage": True},
                            "messages": [{"role": "user", "content": prompt(i)}]}
    if cfg.max_tokens is not None:
        body["max_tokens"] = cfg.max_tokens
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                return Outcome(r.status_code, time.perf_counter() - t0,
                               retry_after=r.headers.get("retry-after"), error=text[:300])
            out = Outcome(200, predicted_ttft=_header(r, "x-mooncake-predicted-ttft"),
                          waited=_header(r, "x-mooncake-queue-wait"))
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if out.ttft is None and event.get("choices"):
                    out.ttft = time.perf_counter() - t0
                if event.get("error"):
                    out.status, out.error = 599, str(event["error"])[:300]
                if event.get("usage"):
                    out.tokens = int(event["usage"].get("completion_tokens", 0))
            out.seconds = time.perf_counter() - t0
            return out
    except httpx.HTTPError as e:
        return Outcome(0, time.perf_counter() - t0, error=f"{type(e).__name__}: {e}")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))], 4)


def _decode_counters(client: httpx.Client, url: str) -> dict[str, int]:
    snap = client.get(url + "/v1/instances").json()
    total = dict.fromkeys(DECODE_COUNTERS, 0)
    for inst in snap.get("instances", []):
        if inst.get("role") == "decode":
            for k in DECODE_COUNTERS:
                total[k] += int(inst.get("load", {}).get(k, 0) or 0)
    return total


async def _burst(cfg: BurstConfig, url: str, model: str, progress: Callable[[int, int], None],
                 ids: range | None = None) -> tuple[list[Outcome], float]:
    ids = ids if ids is not None else range(cfg.requests)
    headers = _auth(cfg)
    limits = httpx.Limits(max_connections=len(ids), max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, headers=headers,
                                 timeout=httpx.Timeout(cfg.timeout, connect=60.0)) as client:
        done = 0

        async def run(i: int) -> Outcome:
            nonlocal done
            o = await _one(client, cfg, url, model, i)
            done += 1
            progress(done, cfg.requests)
            return o

        t0 = time.perf_counter()
        outcomes = await asyncio.gather(*(run(i) for i in ids))
        return list(outcomes), time.perf_counter() - t0


def _client(cfg: BurstConfig, url: str, model: str, ids: range,
            start: Any) -> tuple[list[Outcome], float]:
    """One load-generating process: its share of the requests, sent when `start` is set."""
    start.wait()
    return asyncio.run(_burst(cfg, url, model, lambda d, t: None, ids))


def _spread(cfg: BurstConfig, url: str, model: str,
            progress: Callable[[int, int], None]) -> tuple[list[Outcome], float]:
    """The burst from `cfg.clients` processes at once (one event loop cannot send a thousand
    streams without delaying its own measurements)."""
    if cfg.clients <= 1:
        return asyncio.run(_burst(cfg, url, model, progress))
    ctx = multiprocessing.get_context("spawn")
    shares = [range(i, cfg.requests, cfg.clients) for i in range(cfg.clients)]
    with ctx.Manager() as mgr, concurrent.futures.ProcessPoolExecutor(
            cfg.clients, mp_context=ctx) as pool:
        start = mgr.Event()
        futs = [pool.submit(_client, cfg, url, model, ids, start) for ids in shares]
        time.sleep(1.0)  # the processes are up
        t0 = time.perf_counter()
        start.set()
        outcomes: list[Outcome] = []
        for fut in concurrent.futures.as_completed(futs):
            outcomes.extend(fut.result()[0])
            progress(len(outcomes), cfg.requests)
        return outcomes, time.perf_counter() - t0


def summarise(outcomes: list[Outcome], seconds: float, slo: float) -> dict[str, Any]:
    ok = [o for o in outcomes if o.status == 200]
    statuses = Counter(str(o.status) for o in outcomes)
    rep: dict[str, Any] = {
        "requests": len(outcomes), "answered": len(ok), "statuses": dict(statuses),
        "errors": len(outcomes) - len(ok) - statuses.get("429", 0) - statuses.get("503", 0),
        "seconds": round(seconds, 3), "requests_per_s": round(len(ok) / seconds, 3),
        "tokens": sum(o.tokens for o in ok),
        "tokens_per_s": round(sum(o.tokens for o in ok) / seconds, 1),
        "latency_p50_s": _pct([o.seconds for o in ok], 0.5),
        "latency_p99_s": _pct([o.seconds for o in ok], 0.99),
        "ttft_p50_s": _pct([o.ttft for o in ok if o.ttft is not None], 0.5),
        "ttft_p99_s": _pct([o.ttft for o in ok if o.ttft is not None], 0.99),
        "queue_wait_p50_s": _pct([o.waited for o in ok if o.waited is not None], 0.5),
        "queue_wait_max_s": _pct([o.waited for o in ok if o.waited is not None], 1.0),
        "first_errors": sorted({o.error for o in outcomes if o.error and o.status != 429})[:3]}
    pairs = [(o.predicted_ttft, o.ttft) for o in ok
             if o.predicted_ttft is not None and o.ttft is not None]
    if pairs:
        errs = [abs(p - a) for p, a in pairs]
        rep["ttft_prediction_abs_error_p50_s"] = round(statistics.median(errs), 4)
        rep["ttft_prediction_abs_error_p90_s"] = _pct(errs, 0.9)
    if slo:
        met = [o for o in ok if o.ttft is not None and o.ttft <= slo]
        rejected = [o for o in outcomes if o.status == 429]
        rep["slo"] = {"ttft_s": slo, "admitted": len(ok), "met": len(met),
                      "met_fraction": round(len(met) / len(ok), 4) if ok else None,
                      "rejected": len(rejected),
                      "rejected_retry_after_p50_s": _pct(
                          [float(o.retry_after) for o in rejected if o.retry_after], 0.5)}
    return rep


def _start_local(cfg: BurstConfig, kv_blocks: int) -> tuple[Child, str, str]:
    argv = [sys.executable, "-m", "mooncake_cli", "--json", "conductor", "start",
            "--local", cfg.local, "--model", cfg.model, "--port", "0",
            "--kv-blocks", str(kv_blocks)]
    if cfg.ttft_slo:
        argv += ["--ttft-slo", str(cfg.ttft_slo)]
    env = {"OMP_NUM_THREADS": str(cfg.threads)} if cfg.threads else None
    child = Child(argv, "the local cluster", env)
    while True:
        ev = child.line(600)
        if ev.get("event") == "serving":
            return child, str(ev["url"]), str(ev["model"])


def run(cfg: BurstConfig, progress: Callable[[str, int, int], None]) -> dict[str, Any]:
    """One burst per --kv-blocks size (or one against --url); their figures and ratios."""
    runs = []
    for kv in (cfg.kv_blocks if not cfg.url else (0,)):
        label = f"kv-blocks {kv}" if kv else "burst"
        child = None
        if cfg.url:
            url = cfg.url.rstrip("/")
            with httpx.Client(headers=_auth(cfg)) as c:
                model = c.get(url + "/v1/models").json()["data"][0]["id"]
        else:
            child, url, model = _start_local(cfg, kv)
        try:
            with httpx.Client(timeout=120, headers=_auth(cfg)) as c:
                for i in range(cfg.warmup):
                    c.post(url + "/v1/chat/completions", json={
                        "model": model, "max_tokens": 4,
                        "messages": [{"role": "user", "content": f"warm-up {i}"}]})
                before = _decode_counters(c, url)
            def step(done: int, total: int, lb: str = label) -> None:
                progress(lb, done, total)

            outcomes, seconds = _spread(cfg, url, model, step)
            with httpx.Client(timeout=30, headers=_auth(cfg)) as c:
                after = _decode_counters(c, url)
        finally:
            if child is not None:
                child.close()
        rep = summarise(outcomes, seconds, cfg.ttft_slo)
        rep["kv_blocks"], rep["model"] = kv or None, model
        rep["decode"] = {k: after[k] - before[k] for k in DECODE_COUNTERS}
        runs.append(rep)
    base = runs[0]["tokens_per_s"] or 0
    for r in runs:
        r["tokens_per_s_of_first"] = round(r["tokens_per_s"] / base, 3) if base else None
    return {"model": runs[0]["model"], "local": None if cfg.url else cfg.local,
            "url": cfg.url or None, "ttft_slo": cfg.ttft_slo or None,
            "max_tokens": cfg.max_tokens, "requests": cfg.requests, "runs": runs}

