"""Loading errors, the demo model, sampling (seeded, filtered) and stop conditions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from mooncake_cli.engine import (
    CacheFull,
    KVCache,
    ModelError,
    ModelRunner,
    SamplingParams,
    load_model,
)
from mooncake_cli.kvkeys import model_id_from
from tests.helpers.tiny_models import write_model

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("llama"), "llama", seed=3)


def broken(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_files_are_named(llama: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no such file or directory"):
        load_model(tmp_path / "nowhere")
    d = broken(llama, tmp_path / "no-config")
    (d / "config.json").unlink()
    with pytest.raises(ModelError, match="config.json"):
        load_model(d)
    d = broken(llama, tmp_path / "no-tokenizer")
    (d / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match="tokenizer.json"):
        load_model(d)
    d = broken(llama, tmp_path / "no-weights")
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="safetensors"):
        load_model(d)


def test_unsupported_settings_are_refused(llama: Path, tmp_path: Path) -> None:
    cases = [({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"},
              "unsupported architecture"),
             ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
              "rope scaling type 'yarn'"),
             ({"hidden_act": "gelu"}, "hidden_act"),
             ({"num_key_value_heads": 3}, "multiple of num_key_value_heads")]
    for i, (change, message) in enumerate(cases):
        d = broken(llama, tmp_path / f"case{i}")
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(change)
        (d / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ModelError, match=message):
            load_model(d)
    with pytest.raises(ModelError, match="dtype"):
        load_model(llama, dtype="int4")
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="CUDA is not available"):
            load_model(llama, device="cuda")


def test_demo_is_labelled_and_deterministic() -> None:
    a, b = load_model("demo"), load_model("demo")
    assert "meaningless" in a.description
    assert torch.equal(a.transformer.w.layers[0].qkv, b.transformer.w.layers[0].qkv)
    prompt = a.tokenizer.encode("hello mooncake")
    assert a.tokenizer.decode(prompt) == "hello mooncake"
    runner = ModelRunner(a, KVCache(a.namespace(16), 32))
    [seq] = runner.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))
    assert len(seq.output_ids) == 8 and seq.finish_reason == "length"


def test_seeded_sampling_is_reproducible(llama: Path) -> None:
    model = load_model(llama)
    runner = ModelRunner(model, KVCache(model.namespace(8), 64))
    prompt = model.tokenizer.encode("The KV cache")

    def run(seed: int, **kw: float) -> list[int]:
        p = SamplingParams(max_tokens=24, temperature=1.0, seed=seed, ignore_eos=True, **kw)
        return runner.generate([prompt], p)[0].output_ids

    assert run(7) == run(7)
    assert run(7) != run(8)
    assert run(7, top_k=3) == run(7, top_k=3)
    assert run(7, top_p=0.5) == run(7, top_p=0.5)
    greedy = runner.generate([prompt], SamplingParams(max_tokens=24, ignore_eos=True))[0]
    assert run(1, top_k=1) == greedy.output_ids  # top-k 1 can only pick the argmax


def test_top_p_and_top_k_filter() -> None:
    from mooncake_cli.engine.sampler import Sampler

    logits = torch.tensor([[5.0, 4.9, 0.0, -1.0, -2.0]])
    gen = torch.Generator().manual_seed(0)
    sampler = Sampler()
    picks = {sampler(logits, [SamplingParams(temperature=1.0, top_p=0.6)], [gen])[0]
             for _ in range(200)}
    assert picks == {0, 1}
    picks = {sampler(logits, [SamplingParams(temperature=5.0, top_k=3)], [gen])[0]
             for _ in range(300)}
    assert picks == {0, 1, 2}


def test_stop_conditions(llama: Path) -> None:
    model = load_model(llama)
    runner = ModelRunner(model, KVCache(model.namespace(8), 64))
    prompt = model.tokenizer.encode("Prefill computes the cache")
    [free] = runner.generate([prompt], SamplingParams(max_tokens=20, ignore_eos=True))
    stop_id = free.output_ids[5]
    first = free.output_ids.index(stop_id)
    [s] = runner.generate([prompt], SamplingParams(max_tokens=20, stop_token_ids=(stop_id,)))
    assert s.output_ids == free.output_ids[:first + 1] and s.finish_reason == "stop"
    target = free.text[3:6]
    [s] = runner.generate([prompt], SamplingParams(max_tokens=20, ignore_eos=True,
                                                   stop=(target,)))
    assert s.finish_reason == "stop" and target not in s.text
    assert free.text.startswith(s.text) and len(s.output_ids) < 20
    with pytest.raises(ModelError, match="top_p"):
        SamplingParams(top_p=0.0)


def test_cache_full_is_clear() -> None:
    model = load_model("demo")
    runner = ModelRunner(model, KVCache(model.namespace(4), 3))
    with pytest.raises(CacheFull, match="need 8 blocks, 3 of 3 free"):
        runner.generate([list(range(30))], SamplingParams(max_tokens=2))
    assert runner.cache.allocator.free == 3
    [seq] = runner.generate([list(range(9))], SamplingParams(max_tokens=2, ignore_eos=True))
    assert len(seq.output_ids) == 2 and runner.cache.allocator.free == 3


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_reuse_is_exact(dtype: str) -> None:
    model = load_model("demo", dtype=dtype)
    ns = model.namespace(8)
    assert ns.dtype == dtype and ns.block_bytes == 4 * 2 * 2 * 8 * 32 * 2
    prompt = model.tokenizer.encode("mooncake " * 10)
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    source = ModelRunner(model, KVCache(ns, 64))
    [base] = source.generate([prompt], params, release=False)
    reuse = (len(prompt) - 1) // 8
    blobs = [source.cache.export_block(b).view(torch.uint8).numpy().tobytes()
             for b in base.block_table[:reuse]]
    target = ModelRunner(model, KVCache(ns, 64))
    seq = target.new_sequence(prompt, params)
    target.cache.ensure(seq.block_table, reuse * 8)
    for b, blob in zip(seq.block_table, blobs, strict=True):
        target.cache.import_block(b, blob)
    seq.num_computed = reuse * 8
    target.prefill(seq)
    target.run_to_completion([seq])
    assert seq.output_ids == base.output_ids


def test_model_id_names_the_checkpoint_not_the_path(llama: Path, tmp_path: Path) -> None:
    same = broken(llama, tmp_path / "a" / llama.name)
    other = write_model(tmp_path / "b" / llama.name, "llama", seed=4)  # same name, new weights
    ids = [load_model(d).model_id for d in (llama, same, other)]
    assert ids[0] == ids[1] != ids[2]
    assert ids[0].startswith(llama.name + "-")
    assert model_id_from(str(llama)) == ids[0]  # what the conductor derives without loading
    assert load_model(llama, model_id="my-llama").namespace(16).tag().startswith("my-llama/")
