"""SamplingParams: validated and frozen, from the OpenAI edge to the engine (no torch here:
the conductor imports it; `engine.sampler` turns logits into tokens)."""

from __future__ import annotations

import math
from dataclasses import dataclass

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
