"""Layer stages: one prefill spread over several instances, each running a range of layers on
the prompt's chunks as they come (chunked pipeline parallelism, section 5.1 of the paper).

    ranges = split_layers(model.config.num_layers, 2)          # [range(0, 15), range(15, 30)]
    lead = StageRunner(model, KVCache(ns, 256), ranges[0])     # the lead: a full cache
    tail = StageRunner(model, KVCache(ns, 256, layers=ranges[1]), ranges[1])
    a, b = lead.new_sequence(prompt), tail.new_sequence(len(prompt))
    while a.num_pending:
        n = min(a.num_pending, chunk)
        h = tail.step(b, n, lead.step(a, n))                   # hidden states [n, hidden]
    token = lead.sample(a, lead.logits(h[-1:]))                # the lead owns the answer

A stage's KV cache holds its own layers only: its pool block is the contiguous slice
[lo * layer_bytes, hi * layer_bytes) of the block's store object (kvkeys' layout), so slices
copied into a full block at those offsets make the object a single instance would have made.
Each chunk runs exactly the operations a single-instance `ModelRunner.step` of the same chunk
runs, so with the same chunk size the KV and the logits are bit for bit the same.
"""

from __future__ import annotations

import torch

from mooncake_cli.engine.batch import StepBatch
from mooncake_cli.engine.errors import ModelError
from mooncake_cli.engine.kvcache import KVCache
from mooncake_cli.engine.loader import Model
from mooncake_cli.engine.sampler import Sampler
from mooncake_cli.engine.sampling import SamplingParams
from mooncake_cli.engine.sequence import Sequence, SequenceIds


def split_layers(num_layers: int, stages: int) -> list[range]:
    """`stages` contiguous layer ranges of near-equal size (earlier ones get the remainder),
    the equal shares the simulator's pipeline estimate assumes."""
    if not 1 <= stages <= num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {stages} stages")
    size, extra = divmod(num_layers, stages)
    out, lo = [], 0
    for k in range(stages):
        hi = lo + size + (1 if k < extra else 0)
        out.append(range(lo, hi))
        lo = hi
    return out


class StageRunner:
    """Runs layers `layers` of `model` over `cache` (which must hold at least those layers;
    the lead's holds all of them, to gather the other stages' slices into whole blocks)."""

    def __init__(self, model: Model, cache: KVCache, layers: range) -> None:
        n = model.config.num_layers
        if not layers or layers.step != 1 or not 0 <= layers.start < layers.stop <= n:
            raise ModelError(f"layers {layers} is not a range of the model's {n}")
        if not (cache.layers.start <= layers.start and layers.stop <= cache.layers.stop):
            raise ModelError(f"KV cache of layers {cache.layers} lacks stage layers {layers}")
        if cache.ns != model.namespace(cache.block_size):
            raise ModelError(f"KV cache {cache.ns.tag()} does not fit model "
                             f"{model.namespace(cache.block_size).tag()}")
        self.model = model
        self.cache = cache
        self.layers = layers
        self.first = layers.start == 0
        self.last = layers.stop == n
        self.hidden_size = model.config.hidden_size
        self.sampler = Sampler()
        self._ids = SequenceIds()

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's hidden state (what a stage hands the next per token)."""
        return self.hidden_size * self.model.dtype.itemsize

    @property
    def slice_offset(self) -> int:
        """Where this stage's layers start in a block's store object, in bytes."""
        return self.layers.start * self.cache.layer_bytes

    @property
    def slice_bytes(self) -> int:
        return len(self.layers) * self.cache.layer_bytes

    def new_sequence(self, prompt: list[int] | int,
                     params: SamplingParams | None = None) -> Sequence:
        """The lead's sequence of the prompt's tokens; another stage's of `prompt` tokens (it
        reads only their positions: its input is the previous stage's hidden states)."""
        if isinstance(prompt, int):
            if self.first:
                raise ModelError("the first stage needs the prompt's token ids")
            prompt = [0] * prompt
        if len(prompt) >= self.model.config.max_position:
            raise ModelError(f"prompt of {len(prompt)} tokens does not fit the model's "
                             f"{self.model.config.max_position} positions")
        return Sequence(list(prompt), params or SamplingParams(), seq_id=self._ids())

    def step(self, seq: Sequence, n: int, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """This stage's layers on the next `n` pending tokens of `seq` (the lead embeds them,
        the others take the previous stage's `hidden` [n, hidden_size]); their K/V go into the
        cache. The chunk's hidden states after these layers, [n, hidden_size]."""
        if not 1 <= n <= seq.num_pending:
            raise ValueError(f"a step advances by 1..{seq.num_pending} tokens, not {n}")
        if (hidden is None) != self.first:
            raise ValueError("the first stage embeds tokens; the others take hidden states")
        if hidden is not None and (tuple(hidden.shape) != (n, self.hidden_size)
                                   or hidden.dtype != self.model.dtype):
            raise ValueError(f"hidden states of {tuple(hidden.shape)} {hidden.dtype}, expected "
                             f"({n}, {self.hidden_size}) {self.model.dtype}")
        self.cache.ensure(seq.block_table, seq.num_computed + n)
        t = self.model.transformer
        batch = StepBatch.build([seq], [n], self.cache.block_size,
                                self.model.config.sliding_window, self.model.device)
        x = t.embed(batch) if hidden is None else hidden.to(self.model.device)
        x = t.run_layers(x, batch, self.cache, self.layers)
        seq.num_computed += n
        return x

    def logits(self, last: torch.Tensor) -> torch.Tensor:
        """Logits [1, vocab] from the last stage's hidden state of the prompt's last token."""
        return self.model.transformer.head(last.to(self.model.device).view(1, -1))

    def sample(self, seq: Sequence, logits: torch.Tensor) -> int:
        """The first token, sampled as `ModelRunner.prefill` samples it (the lead's job)."""
        [token] = self.sampler(logits, [seq.params], [seq.generator])
        seq.token_ids.append(token)
        return token

    def adopt_prefix(self, seq: Sequence, blocks: list[torch.Tensor]) -> None:
        """Start `seq` after a reused prefix: `blocks` are its whole store objects (or this
        stage's slices of them), copied into the cache; the next step computes what follows."""
        if seq.num_computed:
            raise ValueError("a prefix is adopted before the first step")
        self.cache.ensure(seq.block_table, len(blocks) * self.cache.block_size)
        for b, data in zip(seq.block_table, blocks, strict=False):
            self.cache.block(b).copy_(self.own_slice(data))
        seq.num_computed = len(blocks) * self.cache.block_size

    def own_slice(self, block: torch.Tensor) -> torch.Tensor:
        """What of a whole block (or of this cache's slice of it) this cache keeps."""
        ns = self.cache.ns
        block = block.view(-1, *ns.block_shape[1:])
        if block.shape[0] == len(self.cache.layers):
            return block
        if block.shape[0] != ns.layers:
            raise ValueError(f"a block of {block.shape[0]} layers fits neither the model's "
                             f"{ns.layers} nor this cache's {len(self.cache.layers)}")
        return block[self.cache.layers.start:self.cache.layers.stop]

    def stage_block(self, b: int) -> torch.Tensor:
        """Pool block b's part for this stage's layers (contiguous when the cache is the
        stage's own), as [layers, 2, kv_heads, block_size, head_dim]."""
        lo = self.layers.start - self.cache.layers.start
        return self.cache.block(b)[lo:lo + len(self.layers)]

    def release(self, seq: Sequence) -> None:
        self.cache.release(seq.block_table)
        seq.num_computed = 0
