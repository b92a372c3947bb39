"""smollm2-135m, a ~1k-token prompt and a single instance's chunked prefill of it: the reference
the pipeline-stage tests compare with (test_engine_stages.py, test_pipeline_handoff.py)."""

from __future__ import annotations

from functools import lru_cache

import torch

from mooncake_cli.engine import KVCache, Model, ModelRunner, load_model
from tests.helpers.smollm import NAME, REPO, long_text

BLOCK, CHUNK, TOKENS, PREFIX = 16, 256, 1000, 512
Result = tuple[torch.Tensor, list[torch.Tensor]]  # first token's logits, whole blocks


@lru_cache(maxsize=1)
def model() -> Model:
    return load_model(NAME)


@lru_cache(maxsize=2)
def prompt(tokens: int) -> tuple[int, ...]:
    """Real prose: the README, and for longer prompts the docs after it."""
    tok = model().tokenizer
    if tokens <= 2000:
        return tuple(tok.encode(long_text(tokens, tok))[:tokens])
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    ids = tok.encode("\n\n".join(p.read_text(encoding="utf-8") for p in docs))
    assert len(ids) >= tokens, "the docs are too short"
    return tuple(ids[:tokens])


def blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK) + 4


@lru_cache(maxsize=4)
def single(tokens: int, prefix: int) -> Result:
    """A single instance's chunked prefill; `prefix` tokens of KV loaded first (the blocks a
    previous prefill of the same prompt computed, as a store would give them back)."""
    m = model()
    ids = list(prompt(tokens))
    runner = ModelRunner(m, KVCache(m.namespace(BLOCK), blocks_for(tokens)), chunk_size=CHUNK)
    seq = runner.new_sequence(ids)
    if prefix:
        reused = single(tokens, 0)[1][:prefix // BLOCK]
        runner.cache.ensure(seq.block_table, prefix)
        for b, data in zip(seq.block_table, reused, strict=False):
            runner.cache.import_block(b, data)
        seq.num_computed = prefix
    while seq.num_pending:
        logits = runner.step([seq])
    return logits, [runner.cache.block(b).clone() for b in seq.block_table]


def assert_same(got: Result, want: Result) -> None:
    assert torch.equal(got[0], want[0]), "first token's logits differ"
    assert int(got[0].argmax()) == int(want[0].argmax())
    assert len(got[1]) == len(want[1])
    for i, (a, b) in enumerate(zip(got[1], want[1], strict=True)):
        assert torch.equal(a, b), f"block {i} differs (layers: " \
            f"{[j for j in range(a.shape[0]) if not torch.equal(a[j], b[j])]})"
