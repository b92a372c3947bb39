"""TTFT of a prompt whose prefix another prefill worker computed, loaded through the store,
against the same prompt length computed from scratch, on one cluster in one run.

The cluster (role_procs.py): a store master, prefill workers A and B, one decode worker, and two
conductors, one routing to A only and one to B only (so each prompt's prefill worker is
chosen, not the policy's). Each repeat: prompt 1 (a fresh prefix of `prefix` tokens, then
`suffix` tokens) through A; once A's /metrics count the prefix's blocks stored, prompt 2 (the
same prefix, another suffix) through B, which finds the prefix in the store ("store"), and
prompt 3 (a prefix never seen, the same suffix) through B ("recompute"); the order of 2 and 3
alternates between repeats. TTFT is the first streamed token's, through the conductor; cached
tokens are what the answer's usage reports (the prefill worker's own count).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import xxhash

from mooncake_cli.bench.role_procs import Role, RoleProcs, RoleSpec
from mooncake_cli.bench.trace_live import Outcome, send
from mooncake_cli.interfaces import ConfigError, MooncakeError

STORED = "mooncake_worker_kv_bytes_stored_total"
STORE_WAIT_S = 120.0


@dataclass(frozen=True)
class ReuseSpec:
    roles: RoleSpec
    prefix: int = 2048
    suffix: int = 64
    repeats: int = 3
    max_tokens: int = 4
    vocab: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prefix", "suffix", "repeats", "max_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if self.prefix < self.roles.block_size:
            raise ConfigError(f"--prefix {self.prefix} is under one block "
                              f"({self.roles.block_size} tokens)")
        if self.vocab < 2:
            raise ConfigError("--vocab must be >= 2")


def tokens(spec: ReuseSpec, tag: str, n: int) -> list[int]:
    """`n` token ids in [1, vocab), the same for the same seed and tag."""
    return [1 + xxhash.xxh64_intdigest(f"{spec.seed}:{tag}:{i}".encode()) % (spec.vocab - 1)
            for i in range(n)]


class _Run:
    def __init__(self, spec: ReuseSpec, procs: RoleProcs) -> None:
        self.spec, self.procs = spec, procs
        self.a = procs.worker("prefill", "prefill-a")
        self.b = procs.worker("prefill", "prefill-b")
        decode = procs.worker("decode", "decode-0")
        self.via_a = procs.conductor([self.a], [decode])
        self.via_b = procs.conductor([self.b], [decode])
        self.model = str(self.via_a.info["model"])

    def send(self, conductor: Role, prompt: list[int], max_tokens: int) -> Outcome:
        got = send(conductor.url, self.model, prompt, max_tokens, 600.0)
        if got.status != 200 or got.ttft is None:
            raise MooncakeError(f"a {len(prompt)}-token prompt through {conductor.url} "
                                f"failed ({got.status}): {got.error}")
        return got

    def wait_stored(self, before: float, blocks: int) -> float:
        """Seconds until A's /metrics count `blocks` more blocks stored than `before`. vLLM
        reports a save with the engine step after it ends, so a 4-token request through A
        (no whole block, nothing stored) makes a step while waiting."""
        want = before + blocks * int(self.a.info["kv_bytes_per_block"])
        t0 = time.monotonic()
        while self.procs.metrics(self.a.url).get(STORED, 0.0) < want:
            if time.monotonic() - t0 > STORE_WAIT_S:
                raise MooncakeError(f"prefill-a did not report its {blocks} prefix blocks "
                                    f"stored within {STORE_WAIT_S:g} s")
            self.send(self.via_a, tokens(self.spec, f"poke{time.monotonic()}", 4), 1)
            time.sleep(0.2)
        return time.monotonic() - t0

    def repeat(self, r: int) -> dict[str, Any]:
        s = self.spec
        prefix = tokens(s, f"prefix{r}", s.prefix)
        before = self.procs.metrics(self.a.url).get(STORED, 0.0)
        first = self.send(self.via_a, prefix + tokens(s, f"a{r}", s.suffix), s.max_tokens)
        waited = self.wait_stored(before, s.prefix // self.procs.spec.block_size)
        tail = tokens(s, f"b{r}", s.suffix)
        order = [("store", prefix + tail), ("recompute", tokens(s, f"fresh{r}", s.prefix) + tail)]
        row: dict[str, Any] = {"repeat": r, "first_ttft_s": round(first.ttft or 0.0, 4),
                               "store_wait_s": round(waited, 3)}
        for kind, prompt in order if r % 2 == 0 else order[::-1]:
            got = self.send(self.via_b, prompt, s.max_tokens)
            row[f"{kind}_ttft_s"] = round(got.ttft or 0.0, 4)
            row[f"{kind}_cached_tokens"] = got.cached_tokens
        row["ratio"] = round(row["store_ttft_s"] / row["recompute_ttft_s"], 4)
        return row


def _summary(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [float(r[key]) for r in rows]
    return {"mean": round(statistics.fmean(values), 4),
            "median": round(statistics.median(values), 4)}


def measure(spec: ReuseSpec) -> dict[str, Any]:
    """Every repeat's TTFTs, their means and medians, and store over recompute."""
    with RoleProcs(spec.roles) as procs:
        run = _Run(spec, procs)
        for conductor in (run.via_a, run.via_b):  # warm-up: each path's first request
            run.send(conductor, tokens(spec, f"warm{conductor.url}", spec.suffix), 1)
        rows = [run.repeat(r) for r in range(spec.repeats)]
    store, recompute = _summary(rows, "store_ttft_s"), _summary(rows, "recompute_ttft_s")
    return {"setup": {"model": spec.roles.model, "engine": spec.roles.engine,
                      "block_size": spec.roles.block_size, "kv_blocks": spec.roles.kv_blocks,
                      "prefix_tokens": spec.prefix, "suffix_tokens": spec.suffix,
                      "repeats": spec.repeats, "max_tokens": spec.max_tokens},
            "rows": rows, "store_ttft_s": store, "recompute_ttft_s": recompute,
            "first_ttft_s": _summary(rows, "first_ttft_s"),
            "ratio_of_means": round(store["mean"] / recompute["mean"], 4),
            "speedup_of_means": round(recompute["mean"] / store["mean"], 3)}
