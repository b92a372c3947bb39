"""Pipeline stages in one process: smollm2-135m's layers split into 2 and 3 ranges, run in
sequence on the prompt's chunks (each stage's hidden states handed to the next), give the
first token's logits and every block's KV of every layer bit for bit as a single-instance
prefill with the same chunk size does, with and without a reused prefix; greedy decoding on
the gathered blocks gives transformers' tokens. The hand-off through the transfer engine
between processes: test_pipeline_handoff.py."""

from __future__ import annotations

import os

import pytest
import torch

from mooncake_cli.engine import KVCache, ModelRunner, SamplingParams
from mooncake_cli.engine.stages import StageRunner, split_layers
from tests.helpers.smollm import Reference, gguf_path
from tests.helpers.stage_ref import (
    BLOCK,
    CHUNK,
    PREFIX,
    TOKENS,
    Result,
    assert_same,
    blocks_for,
    model,
    prompt,
    single,
)

pytestmark = pytest.mark.timeout(900)


def pipeline(tokens: int, stages: int, prefix: int) -> Result:
    """The same prefill through `stages` layer ranges: each chunk goes through every stage in
    turn; each stage keeps its own layers' KV; the lead gathers the other stages' slices of
    each block as the block completes (what their WRITEs do across processes)."""
    m = model()
    ids = list(prompt(tokens))
    ns, ranges = m.namespace(BLOCK), split_layers(m.config.num_layers, stages)
    n_blocks = blocks_for(tokens)
    runners = [StageRunner(m, KVCache(ns, n_blocks), ranges[0])]
    runners += [StageRunner(m, KVCache(ns, n_blocks, layers=r), r) for r in ranges[1:]]
    seqs = [runners[0].new_sequence(ids)] + [r.new_sequence(len(ids)) for r in runners[1:]]
    if prefix:
        reused = single(tokens, 0)[1][:prefix // BLOCK]
        for r, s in zip(runners, seqs, strict=True):
            r.adopt_prefix(s, reused)  # the lead keeps whole blocks, the others their slices
    lead, gathered = runners[0], prefix // BLOCK
    hidden = torch.empty(0)
    while seqs[0].num_pending:
        n = min(seqs[0].num_pending, CHUNK)
        hidden = lead.step(seqs[0], n)
        for r, s in zip(runners[1:], seqs[1:], strict=True):
            hidden = r.step(s, n, hidden)
        done = len(seqs[0].block_table) if not seqs[0].num_pending \
            else seqs[0].num_computed // BLOCK
        for r, s in zip(runners[1:], seqs[1:], strict=True):
            for i in range(gathered, done):
                whole = lead.cache.block(seqs[0].block_table[i])
                whole[r.layers.start:r.layers.stop].copy_(r.stage_block(s.block_table[i]))
        gathered = done
    assert all(s.num_pending == 0 for s in seqs)
    logits = lead.logits(hidden[-1:])
    return logits, [lead.cache.block(b).clone() for b in seqs[0].block_table]


def test_split_layers() -> None:
    assert split_layers(30, 2) == [range(0, 15), range(15, 30)]
    assert split_layers(30, 4) == [range(0, 8), range(8, 16), range(16, 23), range(23, 30)]
    with pytest.raises(ValueError):
        split_layers(3, 4)


def test_stage_cache_holds_its_layers_only() -> None:
    ns = model().namespace(BLOCK)
    cache = KVCache(ns, 4, layers=range(10, 20))
    assert cache.block_bytes == ns.block_bytes // 3 == cache.layer_bytes * 10
    assert cache.layer(10)[0].data_ptr() == cache.pool[:, 0, 0].data_ptr()
    with pytest.raises(IndexError):
        cache.layer(9)
    with pytest.raises(ValueError):
        KVCache(ns, 4, layers=range(20, 31))


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("prefix", [0, PREFIX], ids=["fresh", "reused-prefix"])
def test_stages_equal_single_instance(stages: int, prefix: int) -> None:
    assert_same(pipeline(TOKENS, stages, prefix), single(TOKENS, prefix))


def test_greedy_after_stages_matches_transformers() -> None:
    """Decoding from the blocks the 3 stages left gives transformers' greedy continuation."""
    m, new = model(), 6
    ids = list(prompt(TOKENS))
    logits, blocks = pipeline(TOKENS, 3, PREFIX)
    runner = ModelRunner(m, KVCache(m.namespace(BLOCK), blocks_for(TOKENS) + 1))
    seq = runner.new_sequence(ids, SamplingParams(max_tokens=new, ignore_eos=True))
    runner.cache.ensure(seq.block_table, len(ids))
    for b, data in zip(seq.block_table, blocks, strict=True):
        runner.cache.import_block(b, data)
    seq.num_computed = len(ids)
    runner.sample([seq], logits)
    runner.run_to_completion([seq])
    assert seq.output_ids == Reference(gguf_path()).greedy(ids, new)


@pytest.mark.skipif(not os.environ.get("MOONCAKE_SLOW_TESTS"),
                    reason="an 8k-token prompt takes many minutes on a CPU: "
                           "MOONCAKE_SLOW_TESTS=1 runs it")
@pytest.mark.timeout(3600)
def test_stages_equal_single_instance_8k() -> None:
    tokens = 8000
    assert len(prompt(tokens)) == tokens
    assert_same(pipeline(tokens, 3, 4096), single(tokens, 4096))
