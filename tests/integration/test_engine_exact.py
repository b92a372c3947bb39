"""Exactness: our paged-KV runner gives transformers' greedy tokens, with and without KV reuse."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mooncake_cli.engine import KVCache, ModelRunner, SamplingParams, load_model
from mooncake_cli.kvkeys import reusable_blocks
from tests.helpers.tiny_models import PROMPTS, write_model

pytestmark = pytest.mark.timeout(120)
NEW_TOKENS = 40
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module", params=[("llama", False), ("qwen2", True)],
                ids=["llama", "qwen2-tied"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    kind, tie = request.param
    return write_model(tmp_path_factory.mktemp(kind), kind, tie=tie)


def hf_greedy(directory: Path, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    model.generation_config.eos_token_id = None
    out = []
    for ids in prompts:
        x = torch.tensor([ids])
        y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                           min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=1)
        out.append(y[0, len(ids):].tolist())
    return out


def test_greedy_matches_transformers(checkpoint: Path) -> None:
    model = load_model(checkpoint)
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    want = hf_greedy(checkpoint, prompts)
    assert len({tuple(w) for w in want}) > 1, "prompts should lead to different continuations"
    # block size 4 and chunk 5: prompts span several blocks and prefill runs in several chunks
    runner = ModelRunner(model, KVCache(model.namespace(4), 256), chunk_size=5)
    seqs = runner.generate(prompts, GREEDY)
    assert [s.output_ids for s in seqs] == want
    assert runner.cache.allocator.free == 256, "finished sequences release their blocks"


def test_kv_reuse_gives_identical_tokens(checkpoint: Path) -> None:
    model = load_model(checkpoint)
    prompt = model.tokenizer.encode(" ".join(PROMPTS))
    bs = 4
    full = len(prompt) // bs
    assert full >= 10
    source = ModelRunner(model, KVCache(model.namespace(bs), 128))
    [baseline] = source.generate([prompt], GREEDY, release=False)
    exported = [source.cache.export_block(b) for b in baseline.block_table[:full]]

    reuse = reusable_blocks(len(prompt), bs, hits=full)
    assert reuse >= 0.9 * full
    target = ModelRunner(model, KVCache(model.namespace(bs), 128))
    target.cache.allocator.allocate(7)  # different physical blocks than the source used
    seq = target.new_sequence(prompt, GREEDY)
    target.cache.ensure(seq.block_table, reuse * bs)
    for b, data in zip(seq.block_table, exported[:reuse], strict=True):
        target.cache.import_block(b, data.numpy().tobytes())  # as bytes from the store
    seq.num_computed = reuse * bs
    assert set(seq.block_table).isdisjoint(range(7))
    target.prefill(seq)
    target.run_to_completion([seq])
    assert seq.output_ids == baseline.output_ids


def test_batched_decode_of_different_lengths_matches_single(checkpoint: Path) -> None:
    model = load_model(checkpoint)
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    runner = ModelRunner(model, KVCache(model.namespace(8), 256))
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = [runner.generate([p], params)[0].output_ids for p in prompts]
    together = [s.output_ids for s in runner.generate(prompts, params)]
    assert together == alone


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize("kind,overrides", [("mistral", {"sliding_window": 16}),
                                            ("llama", {"rope_scaling": LLAMA3_ROPE})],
                         ids=["mistral-sliding-window", "llama3-rope"])
def test_variants_match_transformers(kind: str, overrides: dict[str, object],
                                     tmp_path: Path) -> None:
    directory = write_model(tmp_path / kind, kind, seed=5, **overrides)
    model = load_model(directory)
    prompts = [model.tokenizer.encode(p) for p in (PROMPTS[2], " ".join(PROMPTS))]
    assert min(len(p) for p in prompts) > 16  # longer than the window
    runner = ModelRunner(model, KVCache(model.namespace(4), 256), chunk_size=7)
    assert [s.output_ids for s in runner.generate(prompts, GREEDY)] == hf_greedy(directory,
                                                                                 prompts)
