"""GGUF checkpoints written by llama.cpp's own writer (the `gguf` package): greedy tokens,
tokenization and chat rendering equal transformers' loading of the same file, for Llama (q/k
interleaved by the converter) and Qwen2 (biases), quantized Q8_0, Q4_0 and F16, tied or not;
broken files give one clear error each."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mooncake_cli.conductor.chat import ChatTemplate
from mooncake_cli.engine import KVCache, ModelError, ModelRunner, SamplingParams, load_model
from tests.helpers.tiny_gguf import write_gguf
from tests.helpers.tiny_models import PROMPTS, write_model

pytestmark = pytest.mark.timeout(180)
NEW = 20
CASES = [("llama", False, "Q8_0"), ("qwen2", True, "Q4_0"), ("llama", True, "F16")]
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "KV?"}]


@pytest.fixture(scope="module", params=CASES, ids=["-".join(map(str, c)) for c in CASES])
def gguf_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    kind, tie, qtype = request.param
    d = tmp_path_factory.mktemp(f"{kind}-{qtype}")
    hf = write_model(d / "hf", kind, tie=tie)
    return write_gguf(hf, d / "model.gguf", qtype)


def reference(path: Path) -> tuple[object, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32)
    model.generation_config.eos_token_id = None
    return model, AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_greedy_tokens_and_chat_match_transformers(gguf_file: Path) -> None:
    ref, ref_tok = reference(gguf_file)
    model = load_model(gguf_file)
    runner = ModelRunner(model, KVCache(model.namespace(4), 256), chunk_size=5)
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    want = []
    for p, ids in zip(PROMPTS, prompts, strict=True):
        assert ids == ref_tok(p).input_ids  # type: ignore[operator]
        x = torch.tensor([ids])
        y = ref.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW,  # type: ignore[attr-defined]
                         min_new_tokens=NEW, do_sample=False, pad_token_id=1)
        want.append(y[0, len(ids):].tolist())
    seqs = runner.generate(prompts, SamplingParams(max_tokens=NEW, ignore_eos=True))
    assert [s.output_ids for s in seqs] == want
    chat = ChatTemplate.from_spec(model.chat)
    text = ref_tok.apply_chat_template(CONVERSATION, tokenize=False,  # type: ignore[attr-defined]
                                       add_generation_prompt=True)
    assert chat.native and chat.render(CONVERSATION) == text
    assert model.eos_token_ids == (1,)


def test_loading_streams_one_tensor_at_a_time(gguf_file: Path) -> None:
    from mooncake_cli.engine.gguf_file import GGUFCheckpoint

    seen = 0
    for name, t in GGUFCheckpoint(gguf_file).tensors():
        assert name.startswith(("model.", "lm_head")) and t.dtype == torch.float32
        seen += 1
    assert seen >= 2 * 9 + 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("broken")
    return write_gguf(write_model(d / "hf", "llama"), d / "ok.gguf", "Q8_0")


def test_wrong_magic(tiny: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + tiny.read_bytes()[4:])
    with pytest.raises(ModelError, match=r"not a GGUF file \(magic b'GGML'"):
        load_model(bad)


@pytest.mark.parametrize("keep", [0.01, 0.5, 0.99])
def test_truncated_file(tiny: Path, tmp_path: Path, keep: float) -> None:
    cut = tmp_path / "cut.gguf"
    data = tiny.read_bytes()
    cut.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ModelError, match="truncated"):
        load_model(cut)


def test_unsupported_quantisation_type(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "q8k.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    q = gguf.GGMLQuantizationType.Q8_K
    block, size = gguf.GGML_QUANT_SIZES[q]
    w.add_tensor("blk.0.attn_q.weight", np.zeros((4, size), dtype=np.uint8), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="blk.0.attn_q.weight has quantisation type Q8_K"):
        load_model(path)
    assert block == 256


def test_unsupported_architecture(tiny: Path, tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="unsupported architecture 'gpt2'"):
        load_model(path)


def test_command_line_reports_one_line(tiny: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    shutil.copy(tiny, cut)
    with cut.open("r+b") as f:
        f.truncate(cut.stat().st_size // 2)
    done = subprocess.run([sys.executable, "-m", "mooncake_cli", "decode", "--model", str(cut)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "truncated" in lines[0]
    assert "Traceback" not in done.stderr


def test_same_name_different_weights_never_share_kv(tmp_path: Path) -> None:
    from mooncake_cli.engine.source import open_source

    a = write_gguf(write_model(tmp_path / "hf-a", "llama", seed=1), tmp_path / "model.gguf")
    (tmp_path / "b").mkdir()
    b = write_gguf(write_model(tmp_path / "hf-b", "llama", seed=2), tmp_path / "b" / "model.gguf")
    (tmp_path / "copy").mkdir()
    same = tmp_path / "copy" / "model.gguf"
    shutil.copy(a, same)
    ids = [open_source(p).model_id for p in (a, b, same)]
    assert ids[0] != ids[1] and ids[0] == ids[2] and ids[0].startswith("model.gguf-")


def test_sentencepiece_tokenizer_matches_transformers(tmp_path: Path) -> None:
    """A `llama` (SentencePiece BPE, byte fallback) vocabulary in GGUF metadata: the tokenizer
    we rebuild encodes and decodes as transformers' rebuild of the same file."""
    import gguf
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer

    from mooncake_cli.engine.gguf_file import GGUFCheckpoint
    from mooncake_cli.engine.gguf_tokenizer import build_tokenizer
    from mooncake_cli.engine.tokenizer import HFTokenizer
    from tests.helpers.tiny_models import CORPUS

    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    trained = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                     split=False)
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=420, special_tokens=specials, show_progress=False))
    model = json.loads(trained.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].__getitem__)
    path = tmp_path / "sp.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types([2 if t == "<unk>" else 3 if t in ("<s>", "</s>") else
                       6 if t.startswith("<0x") else 1 for t in tokens])
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = HFTokenizer.from_object(build_tokenizer(GGUFCheckpoint(path).meta, str(path)))
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in ["The KV cache is the centre", " leading space", "café ünïcode ☃",
                 "a  b\n\nc", "Prefill computes the cache;"]:
        ids = ours.encode(text)
        assert ids == theirs(text).input_ids and ids[0] == 1
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
