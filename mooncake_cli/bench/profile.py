"""`bench profile`: time prefill over (input, cached prefix) and decode steps over batch size.

Every sample runs the real engine (`ModelRunner`) on this machine. A prefill sample computes
`n - p` tokens after a `p`-token prefix already in the paged cache (those blocks hold stale KV
from earlier samples: the compute cost does not depend on their values), chunk by chunk as a
prefill worker does. A decode sample is one `ModelRunner.decode` step of `batch` sequences of
`context` tokens each. Each time is the fastest of `repeats` rounds after a warm-up round:
other work on the machine only ever adds time, so the minimum is the steadiest estimate.

The samples are written in the conductor's profile schema (see
mooncake_cli.conductor.costmodel); `profile_fit` fits it and scores the fit on held-out points.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mooncake_cli.config import size_field
from mooncake_cli.engine import KVCache, ModelRunner, SamplingParams, load_model
from mooncake_cli.interfaces import ConfigError

Progress = Callable[[str, int, int], None]
DECODE = SamplingParams(max_tokens=1 << 20, ignore_eos=True)


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--{what}: comma-separated integers, not {text!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(f"--{what}: needs integers >= 1, got {text!r}")
    return tuple(sorted(set(values)))


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--cached: comma-separated fractions, not {text!r}") from None
    if not values or min(values) < 0 or max(values) >= 1:
        raise ConfigError(f"--cached: fractions in [0, 1), got {text!r}")
    return tuple(sorted(set(values)))


@dataclass(frozen=True)
class ProfileConfig:
    """What `bench profile` measures ([bench_profile] in the config file)."""

    model: str = "demo"
    device: str = "cpu"
    dtype: str = "float32"
    block_size: int = 16
    chunk_size: int = 512
    lengths: str = "128,256,512,1024,2048"  # prefill input lengths
    cached: str = "0,0.5,0.9"  # cached-prefix fractions of each length
    batches: str = "1,2,4,8,16,32"  # decode batch sizes
    contexts: str = "128,512"  # decode context tokens per sequence
    repeats: int = 3  # timed rounds per point; the fastest is kept
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    bandwidth: int = size_field(10**10, "KV transfer bytes/s between instances")
    output: str = "profile.json"

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.chunk_size < 1 or self.repeats < 1:
            raise ConfigError("--block-size, --chunk-size and --repeats must be >= 1")
        if self.threads < 0:
            raise ConfigError("--threads must be >= 0 (0: torch's default)")
        if self.bandwidth < 1:
            raise ConfigError("--bandwidth must be > 0 bytes/s")
        if len(self.axes()[0]) < 3:
            raise ConfigError("--lengths: give at least 3 lengths (the fit has 3 terms)")

    def axes(self) -> tuple[tuple[int, ...], tuple[float, ...], tuple[int, ...], tuple[int, ...]]:
        """(lengths, cached fractions, batches, contexts), parsed and sorted."""
        return (_ints(self.lengths, "lengths"), _fractions(self.cached),
                _ints(self.batches, "batches"), _ints(self.contexts, "contexts"))

    def grid(self, held_out: bool) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(prefill (n, p) points, decode (batch, context) points): the fitting grid, or the
        held-out grid between its points (midpoint lengths, batches, fractions)."""
        lengths, fracs, batches, contexts = self.axes()
        if held_out:
            lengths = _mid(lengths)
            fracs = tuple((a + b) / 2 for a, b in zip(fracs, fracs[1:], strict=False)) or fracs
            batches = _mid(batches) or batches
            contexts = _mid(contexts) or contexts
        bs = self.block_size
        prefill = sorted({(n, min(int(f * n) // bs * bs, (n - 1) // bs * bs))
                          for n in lengths for f in fracs})
        decode = [(b, c) for b in batches for c in contexts]
        return prefill, decode


def _mid(values: tuple[int, ...]) -> tuple[int, ...]:
    mids = {round((a * b) ** 0.5) for a, b in zip(values, values[1:], strict=False)}
    return tuple(sorted(mids - set(values)))


class Profiler:
    """Times the engine; one KV cache sized for the largest point of both grids."""

    def __init__(self, cfg: ProfileConfig) -> None:
        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.model = load_model(cfg.model, cfg.device, cfg.dtype)
        pre = cfg.grid(False)[0] + cfg.grid(True)[0]
        dec = cfg.grid(False)[1] + cfg.grid(True)[1]
        bs = cfg.block_size
        need = max([-(-n // bs) + 1 for n, _ in pre] + [b * -(-c // bs)
                                                         for b, c in dec])
        self.cache = KVCache(self.model.namespace(bs), need, self.model.device)
        self.runner = ModelRunner(self.model, self.cache, cfg.chunk_size)
        self.gen = torch.Generator().manual_seed(0)

    def _tokens(self, n: int) -> list[int]:
        vocab = self.model.config.vocab_size
        return [int(t) for t in torch.randint(0, vocab, (n,), generator=self.gen)]

    def prefill(self, n: int, p: int) -> float:
        """Seconds for one prefill of `n` tokens after a cached `p`-token prefix."""
        seq = self.runner.new_sequence(self._tokens(n), SamplingParams(max_tokens=1))
        self.cache.ensure(seq.block_table, p)
        seq.num_computed = p
        start = time.perf_counter()
        self.runner.prefill(seq)
        seconds = time.perf_counter() - start
        self.runner.release(seq)
        return seconds

    def decode(self, batch: int, context: int) -> tuple[float, int]:
        """(seconds, context tokens) of one decode step of `batch` `context`-token sequences."""
        seqs = [self.runner.new_sequence(self._tokens(context), DECODE) for _ in range(batch)]
        for s in seqs:
            self.cache.ensure(s.block_table, context - 1)
            s.num_computed = context - 1
        start = time.perf_counter()
        self.runner.decode(seqs)
        seconds = time.perf_counter() - start
        for s in seqs:
            self.runner.release(s)
        return seconds, batch * context

    def measure(self, progress: Progress | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """(fitting samples, held-out samples). Each round visits every point of both grids once,
        in a shuffled order (the first round warms up), so a slow spell of a shared machine
        spreads over all points instead of skewing some."""
        grids = [self.cfg.grid(False), self.cfg.grid(True)]
        points = [(g, kind, i) for g in (0, 1) for kind in (0, 1)
                  for i in range(len(grids[g][kind]))]
        times: dict[tuple[int, int, int], list[float]] = {p: [] for p in points}
        rounds = self.cfg.repeats + 1
        order = random.Random(0)
        done = 0
        for r in range(rounds):
            order.shuffle(points)
            for g, kind, i in points:
                a, b = grids[g][kind][i]
                times[(g, kind, i)].append(self.prefill(a, b) if kind == 0 else
                                           self.decode(a, b)[0])
                done += 1
                if progress:
                    progress(f"round {r + 1}/{rounds}", done, rounds * len(points))

        def samples(g: int) -> dict[str, Any]:
            pre, dec = grids[g]
            return {
                "prefill": [{"input_tokens": n, "cached_tokens": p,
                             "seconds": min(times[(g, 0, i)][1:])}
                            for i, (n, p) in enumerate(pre)],
                "decode": [{"batch": b, "context_tokens": b * c,
                            "seconds": min(times[(g, 1, i)][1:])}
                           for i, (b, c) in enumerate(dec)],
            }
        return samples(0), samples(1)
