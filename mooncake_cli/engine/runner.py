"""ModelRunner: chunked prefill and batched decode of Sequences over one paged KVCache.

    model = load_model("demo")
    cache = KVCache(model.namespace(block_size=16), num_blocks=256, device=model.device)
    runner = ModelRunner(model, cache)
    [seq] = runner.generate([model.tokenizer.encode("hello")], SamplingParams(max_tokens=32))

`step` is the one primitive: any list of sequences, each advancing by some tokens (a prefill
chunk, or 1 in decode), in one forward pass. A scheduler (continuous batching) decides the list.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from mooncake_cli.engine.batch import StepBatch
from mooncake_cli.engine.errors import ModelError
from mooncake_cli.engine.kvcache import KVCache
from mooncake_cli.engine.loader import Model
from mooncake_cli.engine.sampler import Sampler
from mooncake_cli.engine.sampling import SamplingParams
from mooncake_cli.engine.sequence import Sequence, SequenceIds


class ModelRunner:
    """Runs `model` over `cache`; `chunk_size` caps the tokens one prefill step computes."""

    def __init__(self, model: Model, cache: KVCache, chunk_size: int = 512) -> None:
        ns = model.namespace(cache.block_size)
        if ns != cache.ns:
            raise ModelError(f"KV cache {cache.ns.tag()} does not fit model {ns.tag()}")
        if cache.pool.device != model.device:
            raise ModelError(f"KV cache on {cache.pool.device}, model on {model.device}")
        if chunk_size < 1:
            raise ModelError(f"chunk_size must be >= 1, got {chunk_size}")
        self.model = model
        self.cache = cache
        self.chunk_size = chunk_size
        self.sampler = Sampler()
        self._ids = SequenceIds()

    def new_sequence(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Sequence:
        limit = self.model.config.max_position
        if len(prompt_ids) >= limit:
            raise ModelError(f"prompt of {len(prompt_ids)} tokens does not fit the model's "
                             f"{limit} positions")
        vocab = self.model.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise ModelError(f"prompt token ids must be in [0, {vocab})")
        return Sequence(list(prompt_ids), params or SamplingParams(), seq_id=self._ids())

    def step(self, seqs: Seq[Sequence], counts: Seq[int] | None = None) -> torch.Tensor:
        """Compute KV for the next `counts[i]` pending tokens of each sequence (default: all,
        capped by chunk_size); logits [B, vocab] of each one's last computed token."""
        if counts is None:
            counts = [min(s.num_pending, self.chunk_size) for s in seqs]
        if not seqs or any(n < 1 or n > s.num_pending for s, n in zip(seqs, counts, strict=True)):
            raise ValueError("each sequence must advance by 1..num_pending tokens")
        for s, n in zip(seqs, counts, strict=True):
            self.cache.ensure(s.block_table, s.num_computed + n)
        batch = StepBatch.build(seqs, counts, self.cache.block_size,
                                self.model.config.sliding_window, self.model.device)
        logits = self.model.transformer.forward(batch, self.cache)
        for s, n in zip(seqs, counts, strict=True):
            s.num_computed += n
        return logits

    def sample(self, seqs: Seq[Sequence], logits: torch.Tensor) -> list[int]:
        """Append one token to each sequence from its logits row and apply stop conditions."""
        tokens = self.sampler(logits, [s.params for s in seqs], [s.generator for s in seqs])
        for s, t in zip(seqs, tokens, strict=True):
            s.token_ids.append(t)
            self._check_stop(s, t)
        return tokens

    def prefill(self, seq: Sequence) -> int:
        """Compute all pending prompt tokens chunk by chunk; sample and return the first token."""
        while True:
            logits = self.step([seq])
            if seq.num_pending == 0:
                return self.sample([seq], logits)[0]

    def decode(self, seqs: Seq[Sequence]) -> list[int]:
        """One decode step for every sequence (each has exactly one pending token)."""
        return self.sample(seqs, self.step(seqs, [1] * len(seqs)))

    def release(self, seq: Sequence) -> None:
        self.cache.release(seq.block_table)
        seq.num_computed = 0

    def generate(self, prompts: Seq[list[int]], params: SamplingParams | None = None,
                 release: bool = True) -> list[Sequence]:
        """Prefill each prompt, then decode them together until all finish."""
        seqs = [self.new_sequence(p, params) for p in prompts]
        for s in seqs:
            self.prefill(s)
        self.run_to_completion(seqs, release)
        return seqs

    def run_to_completion(self, seqs: Seq[Sequence], release: bool = True) -> None:
        """Decode prefilled sequences in one batch until every one has finished."""
        running = [s for s in seqs if not s.finished]
        while running:
            self.decode(running)
            running = [s for s in running if not s.finished]
        if release:
            for s in seqs:
                self.release(s)

    def _check_stop(self, s: Sequence, token: int) -> None:
        p = s.params
        if p.stop:
            s.text = self.model.tokenizer.decode(s.output_ids)
            hits = [i for i in (s.text.find(x) for x in p.stop) if i >= 0]
            if hits:
                s.text = s.text[:min(hits)]
                s.finish_reason = "stop"
                return
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.model.eos_token_ids):
            s.finish_reason = "stop"
        elif len(s.output_ids) >= p.max_tokens or len(s) >= self.model.config.max_position:
            s.finish_reason = "length"
        if s.finished and not p.stop:
            s.text = self.model.tokenizer.decode(s.output_ids)
