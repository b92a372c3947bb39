"""`bench profile --url`: time prefill and decode steps on a running vLLM (OpenAI-compatible)
server instead of our engine, into the same profile.json.

Prompts are lists of random token ids sent to /v1/completions (greedy), a fresh random prefix
per sample, so that nothing an earlier sample computed is ever reused by chance.

- Prefill (n, p): the first `p` tokens (whole KV blocks) are sent alone first (one token
  generated), so that vLLM's prefix cache holds them; then the whole `n`-token prompt is
  streamed with one token to generate, and the time to its first token is the sample. The
  reuse is checked on every sample: the answer's `usage.prompt_tokens_details.cached_tokens`
  must be `p` (vLLM sends it with --enable-prompt-tokens-details); without it, vLLM's
  `vllm:prefix_cache_hits_total` must rise by at least `p`; with neither, the profile says the
  hits were not verified.
- Decode (batch, context): `batch` streams of `context`-token prompts at once, each generating
  STEADY_STEPS tokens past its prefill allowance (ignore_eos). A step's time is the median
  gap between a stream's tokens while every stream has its first token and none is done (all
  in the batch, none prefilling); the sample's context is the batch's mean context over those
  gaps.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from mooncake_cli.bench.profile_fit import fit_and_write
from mooncake_cli.bench.profile_grid import ProfileConfig, Progress, measure
from mooncake_cli.bench.profile_server_info import ServerInfo, prefix_hits, read_server
from mooncake_cli.http import jsonhttp
from mooncake_cli.interfaces import ConfigError, MooncakeError
from mooncake_cli.scheduler.costmodel import PROFILE_SCHEMA

TOKEN_IDS = (1000, 16000)  # past most models' special tokens, inside every common vocabulary
STEADY_STEPS = 32
PREFILL_STEP_TOKENS = 512  # one prefill step covers at least this many tokens on vLLM
MIN_GAPS = 8  # steady gaps a decode sample needs
REQUEST_S = 600.0
METRIC_LAG_S = 10.0  # vLLM updates its counters a moment after the answer


def decode_tokens(batch: int, context: int) -> int:
    """Tokens each stream of a decode sample generates: the steady steps, plus the steps the
    batch's prefills may overlap."""
    return STEADY_STEPS + -(-batch * context // PREFILL_STEP_TOKENS)


class ServerProfiler:
    """Times one vLLM server over HTTP; counts how the prefix-cache reuse was checked."""

    def __init__(self, cfg: ProfileConfig, info: ServerInfo) -> None:
        self.cfg, self.info = cfg, info
        self.url = f"{info.url}/v1/completions"
        vocab = int(info.config.get("vocab_size") or TOKEN_IDS[1])
        self.ids = (min(TOKEN_IDS[0], vocab // 2), min(TOKEN_IDS[1], vocab))
        self.rng = random.Random(0)
        self.checked = {"usage": 0, "metrics": 0, "none": 0}

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(*self.ids) for _ in range(n)]

    def _body(self, prompt: list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
        return {"model": self.info.model, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, **extra}

    def _stream(self, body: dict[str, Any]) -> Iterator[tuple[float, dict[str, Any]]]:
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        try:
            for event in jsonhttp.events(self.url, body, timeout=REQUEST_S):
                yield time.perf_counter(), event
        except jsonhttp.PeerError as e:
            raise MooncakeError(f"{self.url} refused a {len(body['prompt'])}-token prompt: "
                                f"HTTP {e.status} {e.message}") from None

    def prefill(self, n: int, p: int) -> float:
        """Seconds to the first token of an `n`-token prompt whose first `p` are cached."""
        prompt = self._tokens(n)
        if p:
            answer = jsonhttp.call(self.url, self._body(prompt[:p], 1), timeout=REQUEST_S)
            if answer.status != 200:
                raise MooncakeError(f"{self.url} refused a {p}-token prompt: HTTP "
                                    f"{answer.status} {str(answer.body)[:200]}")
        hits = prefix_hits(self.info.url) if p and not self.checked["usage"] else None
        start = time.perf_counter()
        first, usage = 0.0, None
        for t, event in self._stream(self._body(prompt, 1)):
            if not first and event.get("choices"):
                first = t
            usage = event.get("usage") or usage
        if not first:
            raise MooncakeError(f"{self.url} answered a {n}-token prompt without a token")
        self._check_reuse(n, p, usage, hits)
        return first - start

    def _check_reuse(self, n: int, p: int, usage: Any, hits: float | None) -> None:
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if isinstance(cached, int):
            got, how = cached, "usage"
        elif hits is not None:  # read only when p > 0
            got, how = min(self._hits_gained(hits, p), p), "metrics"  # others may add hits
        else:
            self.checked["none"] += 1 if p else 0
            return
        if got != p:
            raise MooncakeError(f"{self.info.url} reused {got} cached tokens of an {n}-token "
                                f"prompt whose first {p} it had just computed (by its {how}): "
                                "is its prefix cache on, large enough, and nobody else's?")
        self.checked[how] += 1 if p else 0

    def _hits_gained(self, before: float, want: int) -> int:
        """How far vLLM's prefix-hit counter rose past `before`, waited on up to
        METRIC_LAG_S for `want` tokens (the counter follows the answer by a moment)."""
        deadline = time.monotonic() + METRIC_LAG_S
        while (gained := (prefix_hits(self.info.url) or 0.0) - before) < want \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        return int(gained)

    def decode(self, batch: int, context: int) -> tuple[float, int]:
        """(seconds per step, context tokens in the batch) of `batch` streams at once. A sample
        whose streams hardly overlapped (a busy host can start one late) is taken once more
        before the server is said not to run them together."""
        try:
            return self._decode_once(batch, context)
        except NoOverlap:
            return self._decode_once(batch, context)

    def _decode_once(self, batch: int, context: int) -> tuple[float, int]:
        body = [self._body(self._tokens(context), decode_tokens(batch, context),
                           ignore_eos=True, return_token_ids=True) for _ in range(batch)]
        stamps: list[list[tuple[float, int]]] = [[] for _ in range(batch)]
        failed: list[BaseException] = []
        ready = threading.Barrier(batch)

        def stream(i: int) -> None:
            try:
                ready.wait()
                for t, event in self._stream(body[i]):
                    choices = event.get("choices")
                    if choices:
                        ids = choices[0].get("token_ids")
                        stamps[i].append((t, len(ids) if isinstance(ids, list) else 1))
            except BaseException as e:  # re-raised below, in the caller's thread
                failed.append(e)
                ready.abort()

        threads = [threading.Thread(target=stream, args=(i,), daemon=True)
                   for i in range(batch)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if failed:
            raise next((e for e in failed if not isinstance(e, threading.BrokenBarrierError)),
                       failed[0])
        return steady_step(stamps, context, batch)


class NoOverlap(MooncakeError):
    """The streams of a decode sample did not run together for MIN_GAPS steps."""


def steady_step(stamps: list[list[tuple[float, int]]], context: int,
                batch: int) -> tuple[float, int]:
    """(median seconds per token, batch context tokens) over the gaps while all streams run."""
    if any(not s for s in stamps):
        raise MooncakeError("a decode stream ended without a token")
    begin, end = max(s[0][0] for s in stamps), min(s[-1][0] for s in stamps)
    gaps, made = [], []
    for s in stamps:
        produced = s[0][1]
        for (t0, _), (t1, k) in zip(s, s[1:], strict=False):
            if begin <= t0 and t1 <= end:
                gaps.append((t1 - t0) / k)
                made.append(produced)
            produced += k
    if len(gaps) < MIN_GAPS:
        raise NoOverlap(f"the server never ran {batch} streams together for "
                            f"{MIN_GAPS} steps: is its --max-num-seqs under {batch}?")
    return statistics.median(gaps), round(batch * (context + statistics.fmean(made)))


def _check(cfg: ProfileConfig, info: ServerInfo) -> None:
    """ConfigError for points the server cannot run as asked."""
    pre = cfg.grid(False)[0] + cfg.grid(True)[0]
    dec = cfg.grid(False)[1] + cfg.grid(True)[1]
    longest = max([n + 1 for n, _ in pre] + [c + decode_tokens(b, c) for b, c in dec])
    if info.max_model_len and longest > info.max_model_len:
        raise ConfigError(f"{info.url} takes at most {info.max_model_len} tokens per sequence; "
                          f"this grid needs {longest} (lower --lengths or --contexts)")
    need = max(b * (c + decode_tokens(b, c)) for b, c in dec)
    if info.kv_tokens and need > info.kv_tokens:
        raise ConfigError(f"{info.url} holds {info.kv_tokens} KV tokens; the largest decode "
                          f"batch needs {need} (lower --batches or --contexts)")
    if info.prefix_caching is False and any(p for _, p in pre):
        raise ConfigError(f"{info.url} runs without prefix caching: cached prefixes cannot be "
                          "timed (--cached 0, or start vLLM with --enable-prefix-caching)")


def run_server_profile(cfg: ProfileConfig, block_size: int | None = None,
                       progress: Progress | None = None) -> dict[str, Any]:
    """Profile the server at cfg.url, write cfg.output, return the report. `block_size` (the
    flag) must match the server's when it tells its own; it is used when it does not."""
    info = read_server(cfg.url)
    served = info.block_size
    if served and block_size and block_size != served:
        raise ConfigError(f"{info.url} keeps {served}-token KV blocks, not {block_size} "
                          "(--block-size)")
    cfg = replace(cfg, block_size=served or block_size or cfg.block_size)
    _check(cfg, info)
    kv_bytes, kv_from = info.kv_bytes_per_token(cfg.kv_bytes_per_token)
    profiler = ServerProfiler(cfg, info)
    fit, held = measure(cfg, profiler.prefill, profiler.decode, progress)
    engine = f"vLLM {info.version}" if info.version else "an OpenAI-compatible server"
    doc = {
        "schema": PROFILE_SCHEMA,
        "model": info.model,
        "device": f"{engine} at {info.url}",
        "block_tokens": cfg.block_size,
        "kv_bytes_per_token": kv_bytes,
        "bandwidth_bytes_per_s": float(cfg.bandwidth),
        "prefill": fit["prefill"],
        "decode": fit["decode"],
        "held_out": held,
        "server": {"url": info.url, "version": info.version,
                   "block_tokens_from": "the server" if served else "--block-size",
                   "kv_bytes_per_token_from": kv_from,
                   "cached_samples_verified_by": profiler.checked},
    }
    return fit_and_write(doc, cfg.output)
