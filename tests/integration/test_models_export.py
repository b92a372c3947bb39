"""`mooncake models export`: the real SmolLM2-135M GGUF as a Hugging Face folder. Exported once
(float32, over an earlier export with --force, through the CLI with --json); transformers loads
the folder, its weights are bit for bit what our GGUF loader dequantizes, its greedy tokens are
our native engine's, and the chat template is in tokenizer_config.json. Bad inputs are one
`error:` line and a non-zero exit; an interrupted export leaves DIR as it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.smollm import CHATS, NAME, RAW, gguf_path

pytestmark = pytest.mark.timeout(600)
NEW = 12


def mooncake(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mooncake_cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (its parent's hidden export leftovers too) and its bytes."""
    files = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    leftovers = [p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.")]
    return {**files, "leftovers": repr(leftovers).encode()}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("export") / "smollm2"
    out.mkdir()
    (out / "config.json").write_text("{}")  # an earlier export, replaced with --force
    (out / "stale.bin").write_bytes(b"old")
    done = mooncake("--json", "models", "export", NAME, "--hf", str(out), "--dtype", "float32",
                    "--force")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "\r" not in done.stderr  # no bar off a terminal
    return out, json.loads(done.stdout)


def test_json_output_and_files(exported: tuple[Path, dict[str, Any]]) -> None:
    out, info = exported
    want = ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
            "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in out.iterdir()) == want  # stale.bin went with the old folder
    assert info["files"] == want and info["path"] == str(out) and info["dtype"] == "float32"
    assert info["name"] == NAME and info["source"] == str(gguf_path())
    assert info["architecture"] == "LlamaForCausalLM" and 134e6 < info["parameters"] < 135e6
    assert info["size"] == sum(p.stat().st_size for p in out.iterdir())
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_theta"] == 100000.0 and cfg["torch_dtype"] == "float32"  # transformers 4
    assert cfg["tie_word_embeddings"] is True and cfg["num_key_value_heads"] == 3
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2  # <|im_end|>, the GGUF's eos


def test_weights_are_our_loaders_bit_for_bit(exported: tuple[Path, dict[str, Any]]) -> None:
    import torch
    from safetensors.torch import load_file

    from mooncake_cli.engine.gguf_file import GGUFCheckpoint

    theirs = load_file(str(exported[0] / "model.safetensors"))
    ours = dict(GGUFCheckpoint(gguf_path()).tensors())
    assert set(theirs) == set(ours) and len(ours) == 272  # lm_head is tied: not stored
    for name, t in ours.items():
        assert theirs[name].dtype == torch.float32, name
        assert torch.equal(theirs[name], t), name
        # a bfloat16 export is the same cast (checked by hand; one export per run here)
        assert torch.equal(theirs[name].to(torch.bfloat16), t.to(torch.bfloat16)), name


def test_chat_template_in_tokenizer_config(exported: tuple[Path, dict[str, Any]]) -> None:
    from mooncake_cli.engine.gguf_file import GGUFCheckpoint

    tc = json.loads((exported[0] / "tokenizer_config.json").read_text())
    template = GGUFCheckpoint(gguf_path()).meta["tokenizer.chat_template"]
    assert tc["chat_template"] == template
    assert (exported[0] / "chat_template.jinja").read_text() == template
    assert tc["eos_token"] == "<|im_end|>" and tc["model_max_length"] == 8192
    assert tc["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert not {"is_local", "local_files_only", "name_or_path"} & set(tc)


def test_transformers_greedy_equals_our_engine(exported: tuple[Path, dict[str, Any]]) -> None:
    """transformers from the folder and our engine from the GGUF: the same prompt tokens (the
    chat template rendered by each) and the same 12 greedy tokens on three prompts. (Our engine
    equals transformers-from-GGUF: test_smollm_exact.py.)"""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mooncake_cli.conductor.chat import ChatTemplate
    from mooncake_cli.engine import KVCache, ModelRunner, SamplingParams, load_model

    tok = AutoTokenizer.from_pretrained(str(exported[0]))
    hf = AutoModelForCausalLM.from_pretrained(str(exported[0]), dtype=torch.float32)
    hf.generation_config.eos_token_id = None
    model = load_model(NAME)
    chat = ChatTemplate.from_spec(model.chat)
    prompts: list[list[int]] = []
    for messages in CHATS[:2]:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True)
        ids = list(ids["input_ids"] if not isinstance(ids, list) else ids)
        assert ids == model.tokenizer.encode(chat.render(messages), add_special_tokens=False)
        prompts.append(ids)
    raw = list(tok(RAW[0]).input_ids)
    assert raw == model.tokenizer.encode(RAW[0])
    prompts.append(raw)

    runner = ModelRunner(model, KVCache(model.namespace(16), 64))
    seqs = runner.generate(prompts, SamplingParams(max_tokens=NEW, ignore_eos=True))
    for ids, seq in zip(prompts, seqs, strict=True):
        x = torch.tensor([ids])
        y = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW,
                        min_new_tokens=NEW, do_sample=False, pad_token_id=2)
        assert [int(t) for t in y[0, len(ids):]] == list(seq.output_ids)
    first = tok.decode(seqs[0].output_ids, skip_special_tokens=True)
    assert first.startswith("The capital of France is Paris")


def _cases(tmp: Path) -> list[tuple[list[str], int, str]]:
    (tmp / "notgguf.gguf").write_text("hello\n")
    (tmp / "afile").write_text("x")
    (tmp / "full").mkdir()
    (tmp / "full" / "notes.txt").write_text("keep me")
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text("{}")
    ok = str(tmp / "new")
    return [
        (["nosuch-model", "--hf", ok], 2, "no such file and no named model"),
        ([str(tmp / "notgguf.gguf"), "--hf", ok], 2, "not a GGUF file"),
        ([str(tmp), "--hf", ok], 2, "is a folder"),
        ([NAME, "--hf", str(tmp / "afile")], 2, "exists and is not a folder"),
        ([NAME, "--hf", str(tmp / "afile" / "sub")], 2, "afile is not a folder"),
        ([NAME, "--hf", str(tmp / "model")], 2, "not empty (use --force"),
        ([NAME, "--hf", str(tmp / "full"), "--force"], 2, "holds no config.json"),
        ([NAME, "--hf", ok, "--dtype", "int8"], 2, "use one of bfloat16, float32, float16"),
        ([NAME, "--hf", "/proc/mooncake-export"], 6, "cannot write the export folder"),
    ]


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    cases = _cases(tmp_path)
    before = snapshot(tmp_path)
    for args, code, text in cases:
        done = mooncake("models", "export", *args, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == code, (args, done.stderr)
        assert lines and lines[-1].startswith("error:") and text in lines[-1], (args, lines)
        assert "Traceback" not in done.stderr and done.stdout == "", args
        assert snapshot(tmp_path) == before, args
    assert not (tmp_path / "new").exists()
    done = mooncake("--json", "models", "export", "nosuch-model", "--hf", str(tmp_path / "new"))
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_unwritable_parent(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    done = mooncake("models", "export", NAME, "--hf", str(ro / "a" / "b"), timeout=120)
    assert done.returncode == 6 and "cannot write the export folder" in done.stderr
    assert "Traceback" not in done.stderr and list(ro.iterdir()) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_leaves_the_target_as_it_was(tmp_path: Path, signum: int) -> None:
    """Stopped while transformers dequantizes: a model folder given with --force is untouched,
    a new nested DIR and its parents do not appear, and no staging folder is left behind."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text('{"mine": true}')
    (old / "model.safetensors").write_bytes(b"weights")
    before = snapshot(old)
    for target, force in ((old, ["--force"]), (tmp_path / "a" / "b" / "new", [])):
        proc = subprocess.Popen([sys.executable, "-m", "mooncake_cli", "models", "export", NAME,
                                 "--hf", str(target), *force], stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("dequantizing"), line + proc.stderr.read()
        proc.send_signal(signum)
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 130, rest
        assert "Traceback" not in rest
    assert snapshot(old) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
