"""StepBatch: what one forward step needs for a list of (sequence, new tokens).

Attention runs per sequence over that sequence's own blocks (see models/attention.py), so the
batch carries, for each sequence, where its new tokens sit in the flat token dimension, its
context length after the step, and its block table; no padded table or dense mask is built.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from mooncake_cli.engine.sequence import Sequence


@dataclass(frozen=True)
class SeqSlice:
    """One sequence's part of a step: tokens [start, start + n) of the flat batch; `ctx` keys
    (all computed tokens, the new ones included) in the blocks `blocks`."""

    start: int
    n: int
    ctx: int
    blocks: torch.Tensor  # [ceil(ctx / block_size)] pool block ids, on the model's device
    block_list: tuple[int, ...]


@dataclass(frozen=True)
class DecodeBlocks:
    """A decode step's keys as blocks: every block any sequence attends to, once.

    blocks[j] is a pool block of sequence seq[j]; valid[j, o] says whether its offset o holds a
    key that sequence's query may see (inside its context and sliding window)."""

    blocks: torch.Tensor  # [J] pool block ids
    seq: torch.Tensor  # [J] the sequence (row of the batch) each block belongs to
    valid: torch.Tensor  # [J, block_size] bool


@dataclass(frozen=True)
class StepBatch:
    """T new tokens of B sequences."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_blocks: torch.Tensor  # [T] pool block of each new token
    slot_offsets: torch.Tensor  # [T] offset inside that block
    last_index: torch.Tensor  # [B] the last new token of each sequence, as an index into T
    seqs: tuple[SeqSlice, ...]
    window: int | None
    decode: DecodeBlocks | None  # set when every sequence advances by one token

    @property
    def decode_only(self) -> bool:
        return self.decode is not None

    @classmethod
    def build(cls, seqs: Seq[Sequence], counts: Seq[int], block_size: int,
              window: int | None, device: torch.device) -> StepBatch:
        ids: list[int] = []
        pos: list[int] = []
        blocks: list[int] = []
        last: list[int] = []
        slices: list[SeqSlice] = []
        for s, n in zip(seqs, counts, strict=True):
            start = s.num_computed
            first = len(ids)
            ids.extend(s.token_ids[start:start + n])
            p = range(start, start + n)
            pos.extend(p)
            blocks.extend(s.block_table[q // block_size] for q in p)
            last.append(len(ids) - 1)
            table = tuple(s.block_table[:-(-(start + n) // block_size)])
            slices.append(SeqSlice(first, n, start + n, torch.tensor(table, device=device),
                                   table))
        positions = torch.tensor(pos)
        decode = None
        if all(n == 1 for n in counts):
            decode = _decode_blocks(slices, block_size, window, device)

        def dev(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        return cls(input_ids=dev(torch.tensor(ids)), positions=dev(positions),
                   slot_blocks=dev(torch.tensor(blocks)),
                   slot_offsets=dev(positions % block_size),
                   last_index=dev(torch.tensor(last)), seqs=tuple(slices), window=window,
                   decode=decode)


def _decode_blocks(slices: list[SeqSlice], block_size: int, window: int | None,
                   device: torch.device) -> DecodeBlocks:
    blocks: list[int] = []
    owner: list[int] = []
    first: list[int] = []  # position of each block's offset 0
    ctx: list[int] = []
    for i, s in enumerate(slices):
        lo = 0 if window is None else max(0, s.ctx - window)
        for j in range(lo // block_size, len(s.block_list)):
            blocks.append(s.block_list[j])
            owner.append(i)
            first.append(j * block_size)
            ctx.append(s.ctx)
    kpos = torch.tensor(first)[:, None] + torch.arange(block_size)[None, :]
    c = torch.tensor(ctx)[:, None]
    valid = kpos < c
    if window is not None:
        valid &= kpos > c - 1 - window
    return DecodeBlocks(torch.tensor(blocks).to(device), torch.tensor(owner).to(device),
                        valid.to(device))
