"""SamplingParams (validated, frozen) and the Sampler that turns logits into next tokens."""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from mooncake_cli.engine.errors import ModelError

MIN_TEMPERATURE = 1e-5  # below it, logits / temperature overflows float32 to inf


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy, else at least MIN_TEMPERATURE (a smaller one overflows the
    scaled logits); top_k 0 and top_p 1.0 disable those filters; a seed is in [0, 2**64)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ModelError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or not (
                self.temperature == 0.0 or self.temperature >= MIN_TEMPERATURE):
            raise ModelError(f"temperature must be 0 (greedy) or a finite number >= "
                             f"{MIN_TEMPERATURE:g}, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:  # also refuses NaN
            raise ModelError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ModelError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ModelError(f"seed must be in [0, 2**64), got {self.seed}")
        if any(not s for s in self.stop):
            raise ModelError("stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler:
    """Next token per row of logits; seeded rows draw from their own torch.Generator. A row
    that cannot be sampled (non-finite probabilities) falls back to its argmax, so one request
    never fails the others of its batch."""

    def __call__(self, logits: torch.Tensor, params: Seq[SamplingParams],
                 generators: Seq[torch.Generator | None]) -> list[int]:
        logits = logits.float()
        out = logits.argmax(dim=-1).tolist()
        for i, p in enumerate(params):
            if not p.greedy:
                try:
                    out[i] = self._draw(logits[i], p, generators[i])
                except RuntimeError:  # invalid probabilities: keep the argmax
                    pass
        return [int(t) for t in out]

    @staticmethod
    def _draw(row: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
        row = row.double() / p.temperature  # in float32, a tiny temperature overflows
        if p.top_k and p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(row, descending=True)
            probs = sorted_logits.softmax(-1)
            drop = probs.cumsum(-1) - probs >= p.top_p  # keep the smallest set reaching top_p
            row = row.clone()
            row[order[drop]] = float("-inf")
        probs = row.softmax(-1)
        if gen is not None and gen.device != probs.device:
            probs = probs.to(gen.device)
        return int(torch.multinomial(probs, 1, generator=gen).item())
