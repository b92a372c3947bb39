"""Live trace replay: a Mooncake-format trace sent to a running conductor's OpenAI API.

Token ids are synthesised so that equal hash ids give equal token blocks: block `h` of the trace
becomes `block_tokens` ids drawn from xxh64(seed, h, i) (a tiny model on a CPU cannot take the
trace's 512-token blocks, so `block_tokens` scales every request down). Requests are sent at
their (scaled) arrival times with streaming on; TTFT is the time to the first streamed token,
a request's TBT is the mean of its longest 10% token gaps (the paper's definition); the
prefix-hit ratio (tokens the prefill workers reused) and the prefills run as pipelines are
read from the conductor's metrics.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import xxhash

from mooncake_cli.http import jsonhttp
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.sim.metrics import spread
from mooncake_cli.sim.trace import TRACE_BLOCK_TOKENS, TraceRequest


@dataclass(frozen=True)
class ReplayConfig:
    block_tokens: int = 16  # synthesised tokens per trace block
    max_input: int = 512  # tokens; longer prompts are cut
    max_output: int = 16
    vocab: int = 256  # synthesised ids lie in [1, vocab)
    concurrency: int = 64
    seed: int = 0
    ttft_threshold: float = 30.0
    tbt_thresholds: tuple[float, ...] = (0.1, 0.2, 0.3)
    timeout: float = 300.0

    def __post_init__(self) -> None:
        for name in ("block_tokens", "max_input", "max_output", "concurrency"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")
        if self.vocab < 2:
            raise ConfigError("vocab must be >= 2")


def prompt_length(req: TraceRequest, cfg: ReplayConfig) -> int:
    """Tokens of `req`'s synthesised prompt: its length scaled, cut at `max_input`."""
    return min(cfg.max_input, max(1, math.ceil(req.input_tokens * cfg.block_tokens /
                                               TRACE_BLOCK_TOKENS)))


def long_prompts(reqs: list[TraceRequest], cfg: ReplayConfig,
                 min_input: int) -> list[TraceRequest]:
    """The requests whose synthesised prompt has at least `min_input` tokens (their arrival
    times unchanged); ConfigError when none has."""
    if min_input < 0:
        raise ConfigError(f"--min-input must be >= 0 tokens, not {min_input}")
    kept = [r for r in reqs if prompt_length(r, cfg) >= min_input]
    if not kept:
        raise ConfigError(f"no request of the {len(reqs)} read has a prompt of {min_input} "
                          f"tokens or more (at --block-tokens {cfg.block_tokens}, --max-input "
                          f"{cfg.max_input}): raise --limit or lower --min-input")
    return kept


def synthesise(req: TraceRequest, cfg: ReplayConfig) -> list[int]:
    """The prompt of `req`: its blocks' ids, scaled to `block_tokens` per 512-token block."""
    n = prompt_length(req, cfg)
    ids: list[int] = []
    for h in req.hash_ids:
        if len(ids) >= n:
            break
        for i in range(cfg.block_tokens):
            d = xxhash.xxh64_intdigest(f"{cfg.seed}:{h}:{i}".encode())
            ids.append(1 + d % (cfg.vocab - 1))
    return ids[:n]


@dataclass
class Outcome:
    status: int = 0
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    error: str = ""
    arrival: float = 0.0  # seconds after the replay started
    prompt_tokens: int = 0
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens

    def tbt(self) -> float | None:
        if not self.gaps:
            return None
        k = max(1, math.ceil(len(self.gaps) * 0.1))
        top = sorted(self.gaps)[-k:]
        return sum(top) / len(top)


def send(url: str, model: str, prompt: list[int], max_tokens: int,
         timeout: float) -> Outcome:
    """One streamed greedy completion of `prompt` (token ids) at the OpenAI API `url`."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    out, start = Outcome(), time.monotonic()
    last = start
    try:
        for ev in jsonhttp.events(url + "/v1/completions", body, timeout=timeout):
            if "error" in ev:
                out.error = str(ev["error"].get("message", ev["error"]))
                continue
            if ev.get("usage"):
                out.prompt_tokens = int(ev["usage"].get("prompt_tokens", 0))
                details = ev["usage"].get("prompt_tokens_details") or {}
                out.cached_tokens = int(details.get("cached_tokens", 0) or 0)
            if not ev.get("choices") or ev["choices"][0].get("finish_reason"):
                continue
            now = time.monotonic()
            if out.ttft is None:
                out.ttft = now - start
            else:
                out.gaps.append(now - last)
            last = now
        out.status = 200 if not out.error else 500
    except jsonhttp.PeerError as e:
        out.status, out.error = e.status, str(e)
    except OSError as e:
        out.status, out.error = 0, str(e)
    return out


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^mooncake_conductor_{name} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


COUNTERS = ("prefix_hit_tokens_total", "prompt_tokens_total", "pipelined_total",
            "pipeline_fallbacks_total")


def _counters(url: str) -> dict[str, float]:
    """The conductor's COUNTERS, from its /metrics."""
    text = jsonhttp.call(url + "/metrics").body.get("text", "")
    return {name: _metric(text, name) for name in COUNTERS}


def hit_over_time(outcomes: list[Outcome], bins: int = 20) -> list[dict[str, float]]:
    """Prefix-hit ratio (cached / prompt tokens) of the requests arriving in each time bin."""
    served = [o for o in outcomes if o.status == 200 and o.prompt_tokens]
    span = max((o.arrival for o in served), default=0.0)
    width = max(span / bins, 1e-3)
    acc: dict[int, list[int]] = {}
    for o in served:
        b = acc.setdefault(int(o.arrival // width), [0, 0])
        b[0] += o.cached_tokens
        b[1] += o.prompt_tokens
    return [{"t": round(k * width, 3), "hit_ratio": round(v[0] / v[1], 4)}
            for k, v in sorted(acc.items())]


def replay(url: str, reqs: list[TraceRequest], cfg: ReplayConfig,
           progress: Callable[[int, int], None] | None = None,
           samples: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """Replay `reqs` (arrivals already scaled) against the conductor at `url`; when given,
    `samples` receives every request's "ttft" and "tbt" (for plots)."""
    models = jsonhttp.call(url + "/v1/models")
    if models.status != 200 or not models.body.get("data"):
        raise ConfigError(f"{url} is not an OpenAI-compatible server (GET /v1/models "
                          f"answered {models.status})")
    model = models.body["data"][0]["id"]
    before = _counters(url)
    outcomes: list[Outcome] = []
    lock, done = threading.Lock(), [0]
    t0 = time.monotonic()
    base = reqs[0].arrival if reqs else 0.0

    def one(r: TraceRequest) -> Outcome:
        delay = (r.arrival - base) - (time.monotonic() - t0)
        if delay > 0:
            time.sleep(delay)
        o = send(url, model, synthesise(r, cfg), min(max(1, r.output_tokens), cfg.max_output),
                 cfg.timeout)
        o.arrival = r.arrival - base
        with lock:
            done[0] += 1
            if progress is not None:
                progress(done[0], len(reqs))
        return o

    with ThreadPoolExecutor(max_workers=cfg.concurrency) as pool:
        outcomes = list(pool.map(one, reqs))
    wall = time.monotonic() - t0
    got = {k: v - before[k] for k, v in _counters(url).items()}
    ok = [o for o in outcomes if o.status == 200]
    ttft = [o.ttft for o in ok if o.ttft is not None]
    tbt = [t for t in (o.tbt() for o in ok) if t is not None]
    if samples is not None:
        samples["ttft"], samples["tbt"] = [float(t) for t in ttft], tbt
    capacity = {f"{lim * 1e3:g}ms": sum(1 for o in ok if o.ttft is not None
                                        and o.ttft <= cfg.ttft_threshold
                                        and (o.tbt() or 0.0) <= lim)
                for lim in cfg.tbt_thresholds}
    prompt = got["prompt_tokens_total"]
    return {"requests": len(reqs), "served": len(ok),
            "rejected_429": sum(1 for o in outcomes if o.status == 429),
            "errors": sum(1 for o in outcomes if o.status not in (200, 429)),
            "first_error": next((o.error for o in outcomes if o.error), None),
            "ttft_s": spread(ttft), "tbt_s": spread(tbt),
            "prefix_hit_ratio": round(got["prefix_hit_tokens_total"] / prompt, 4)
            if prompt else 0.0,
            "pipelined": int(got["pipelined_total"]),
            "pipeline_fallbacks": int(got["pipeline_fallbacks_total"]),
            "capacity": capacity, "hit_over_time": hit_over_time(outcomes),
            "wall_s": round(wall, 2)}
