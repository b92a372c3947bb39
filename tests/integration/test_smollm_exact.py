"""The real model: SmolLM2-135M-Instruct from its GGUF gives transformers' greedy tokens (from
transformers' own loading of the same file) on 11 prompts, raw and chat, short and 1k+ tokens,
in one process. test_smollm_workers.py runs the same cases across processes and the store."""

from __future__ import annotations

import pytest

from mooncake_cli.conductor.chat import ChatTemplate
from mooncake_cli.engine import KVCache, Model, ModelRunner, SamplingParams, load_model
from tests.helpers.smollm import CHATS, NAME, NEW, cases

pytestmark = pytest.mark.timeout(600)
BLOCK = 16


@pytest.fixture(scope="module")
def model() -> Model:
    return load_model(NAME)


def test_capital_of_france(model: Model) -> None:
    chat = ChatTemplate.from_spec(model.chat)
    ids = model.tokenizer.encode(chat.render(CHATS[0]), add_special_tokens=False)
    runner = ModelRunner(model, KVCache(model.namespace(BLOCK), 64))
    [seq] = runner.generate([ids], SamplingParams(max_tokens=32))
    assert seq.text == "The capital of France is Paris."
    assert seq.finish_reason == "stop"


def test_single_process_matches_transformers(model: Model) -> None:
    assert len(cases()) >= 10
    runner = ModelRunner(model, KVCache(model.namespace(BLOCK), 1024), chunk_size=256)
    seqs = runner.generate([list(c.ids) for c in cases()],
                           SamplingParams(max_tokens=NEW, ignore_eos=True))
    for c, s in zip(cases(), seqs, strict=True):
        assert tuple(s.output_ids) == c.want, c.name
