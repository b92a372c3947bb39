"""`bench profile`: time prefill over (input, cached prefix) and decode steps over batch size.

Every sample runs the real engine (`ModelRunner`) on this machine. A prefill sample computes
`n - p` tokens after a `p`-token prefix already in the paged cache (those blocks hold stale KV
from earlier samples: the compute cost does not depend on their values), chunk by chunk as a
prefill worker does. A decode sample is one `ModelRunner.decode` step of `batch` sequences of
`context` tokens each. Each time is the fastest of `repeats` rounds after a warm-up round:
other work on the machine only ever adds time, so the minimum is the steadiest estimate
(`profile_grid`: the config, the grids and the rounds).

The samples are written in the conductor's profile schema (see
mooncake_cli.scheduler.costmodel); `profile_fit` fits it and scores the fit on held-out points.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from mooncake_cli.bench.profile_grid import ProfileConfig, Progress, measure
from mooncake_cli.engine import KVCache, ModelRunner, SamplingParams, load_model

__all__ = ["ProfileConfig", "Profiler", "Progress"]

DECODE = SamplingParams(max_tokens=1 << 20, ignore_eos=True)


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
        """(fitting samples, held-out samples): `profile_grid.measure` over this engine."""
        return measure(self.cfg, self.prefill, self.decode, progress)
