"""StepBatch: the index tensors one forward step needs for a list of (sequence, new tokens)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from mooncake_cli.engine.sequence import Sequence


@dataclass(frozen=True)
class StepBatch:
    """T new tokens of B sequences. Queries are padded to [B, max_q] for attention."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_blocks: torch.Tensor  # [T] pool block of each new token
    slot_offsets: torch.Tensor  # [T] offset inside that block
    tables: torch.Tensor  # [B, max_blocks] block tables, padded with block 0
    pad_index: torch.Tensor  # [T] row of each new token in the [B * max_q] padded queries
    mask: torch.Tensor  # [B, 1, max_q, max_blocks * block_size] True = may attend
    last_index: torch.Tensor  # [B] the last new token of each sequence, as an index into T
    max_q: int

    @classmethod
    def build(cls, seqs: Seq[Sequence], counts: Seq[int], block_size: int,
              window: int | None, device: torch.device) -> StepBatch:
        ids: list[int] = []
        pos: list[int] = []
        blocks: list[int] = []
        pad: list[int] = []
        last: list[int] = []
        max_q = max(counts)
        max_blocks = max(-(-(s.num_computed + n) // block_size)
                         for s, n in zip(seqs, counts, strict=True))
        tables = torch.zeros((len(seqs), max_blocks), dtype=torch.long)
        q_pos = torch.zeros((len(seqs), max_q), dtype=torch.long)
        ctx = torch.zeros(len(seqs), dtype=torch.long)
        for i, (s, n) in enumerate(zip(seqs, counts, strict=True)):
            start = s.num_computed
            ids.extend(s.token_ids[start:start + n])
            p = list(range(start, start + n))
            pos.extend(p)
            blocks.extend(s.block_table[q // block_size] for q in p)
            pad.extend(range(i * max_q, i * max_q + n))
            last.append(len(ids) - 1)
            tables[i, :len(s.block_table[:max_blocks])] = torch.tensor(s.block_table[:max_blocks])
            q_pos[i, :n] = torch.tensor(p)
            ctx[i] = start + n
        k_pos = torch.arange(max_blocks * block_size)
        k = k_pos[None, None, :]
        mask = (k <= q_pos[:, :, None]) & (k < ctx[:, None, None])
        if window is not None:
            mask &= k > q_pos[:, :, None] - window
        positions = torch.tensor(pos)

        def dev(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        return cls(input_ids=dev(torch.tensor(ids)), positions=dev(positions),
                   slot_blocks=dev(torch.tensor(blocks)),
                   slot_offsets=dev(positions % block_size), tables=dev(tables),
                   pad_index=dev(torch.tensor(pad)), mask=dev(mask[:, None]),
                   last_index=dev(torch.tensor(last)), max_q=max_q)
