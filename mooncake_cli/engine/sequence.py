"""Sequence: one request's tokens, its block table and how far its KV has been computed."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from mooncake_cli.engine.sampling import SamplingParams


@dataclass
class Sequence:
    """Prompt + generated tokens; the first `num_computed` have their KV in `block_table`."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    seq_id: int = 0
    token_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    finish_reason: str | None = None
    text: str = ""
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("a sequence needs at least one prompt token")
        self.token_ids = list(self.prompt_ids)
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt:]

    @property
    def num_pending(self) -> int:
        """Tokens whose KV is not yet computed (prompt tail in prefill; 1 in decode)."""
        return len(self.token_ids) - self.num_computed

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def __len__(self) -> int:
        return len(self.token_ids)


class SequenceIds:
    """Fresh sequence ids for one runner."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def __call__(self) -> int:
        return next(self._next)
