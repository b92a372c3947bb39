"""What `bench profile` measures: its config, the fitting and held-out grids, and the timed
rounds over them (torch-free: profiling a vLLM server needs no torch here).

Each time is the fastest of `repeats` rounds after a warm-up round: other work on the machine
only ever adds time, so the minimum is the steadiest estimate.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mooncake_cli.config import size_field
from mooncake_cli.interfaces import ConfigError

Progress = Callable[[str, int, int], None]
# a prefill sample's seconds for (n, p); a decode sample's (seconds, context tokens in the
# batch) for (batch, context per sequence)
PrefillTimer = Callable[[int, int], float]
DecodeTimer = Callable[[int, int], tuple[float, int]]


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
    url: str = ""  # an OpenAI-compatible vLLM server to profile instead of our engine
    kv_bytes_per_token: int = 0  # with url: 0 reads it from the server

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.chunk_size < 1 or self.repeats < 1:
            raise ConfigError("--block-size, --chunk-size and --repeats must be >= 1")
        if self.threads < 0:
            raise ConfigError("--threads must be >= 0 (0: torch's default)")
        if self.bandwidth < 1:
            raise ConfigError("--bandwidth must be > 0 bytes/s")
        if self.kv_bytes_per_token < 0:
            raise ConfigError("--kv-bytes-per-token must be >= 0 (0: read it from the server)")
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


def measure(cfg: ProfileConfig, prefill: PrefillTimer, decode: DecodeTimer,
            progress: Progress | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fitting samples, held-out samples). Each round visits every point of both grids once,
    in a shuffled order (the first round warms up), so a slow spell of a shared machine
    spreads over all points instead of skewing some."""
    grids = [cfg.grid(False), cfg.grid(True)]
    points = [(g, kind, i) for g in (0, 1) for kind in (0, 1)
              for i in range(len(grids[g][kind]))]
    times: dict[tuple[int, int, int], list[float]] = {p: [] for p in points}
    context: dict[tuple[int, int, int], int] = {}
    rounds = cfg.repeats + 1
    order = random.Random(0)
    done = 0
    for r in range(rounds):
        order.shuffle(points)
        for g, kind, i in points:
            a, b = grids[g][kind][i]
            if kind == 0:
                times[(g, kind, i)].append(prefill(a, b))
            else:
                seconds, context[(g, kind, i)] = decode(a, b)
                times[(g, kind, i)].append(seconds)
            done += 1
            if progress:
                progress(f"round {r + 1}/{rounds}", done, rounds * len(points))

    def samples(g: int) -> dict[str, Any]:
        pre, dec = grids[g]
        return {
            "prefill": [{"input_tokens": n, "cached_tokens": p,
                         "seconds": min(times[(g, 0, i)][1:])}
                        for i, (n, p) in enumerate(pre)],
            "decode": [{"batch": b, "context_tokens": context[(g, 1, i)],
                        "seconds": min(times[(g, 1, i)][1:])}
                       for i, (b, _) in enumerate(dec)],
        }
    return samples(0), samples(1)
