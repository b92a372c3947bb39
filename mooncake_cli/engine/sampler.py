"""The Sampler: logits -> next tokens, per request's SamplingParams."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from mooncake_cli.engine.sampling import SamplingParams


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
