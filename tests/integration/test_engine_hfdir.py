"""Hugging Face directories as transformers 4 and 5 write them: no `architectures` (only
`model_type`), a tied model saved under `lm_head.weight` only, several shards, the EOS ids of
generation_config.json, and chat templates in chat_template.jinja, chat_template.json or
tokenizer_config.json, rendered exactly as transformers' apply_chat_template renders them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mooncake_cli.conductor.chat import ChatTemplate
from mooncake_cli.engine import KVCache, ModelRunner, SamplingParams, load_model
from tests.helpers.tiny_models import PROMPTS, write_model
from tests.integration.test_engine_exact import NEW_TOKENS, hf_greedy

pytestmark = pytest.mark.timeout(180)
SMOL_STYLE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LOOPS = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}"
         "{% endif %}[{{ m['role'] | upper }}] {{ m['content'] | tojson }}{{ eos_token }}\n"
         "{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}")
CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Où est Paris?"},
     {"role": "assistant", "content": "In France."}, {"role": "user", "content": "And \"Rome\"?"}],
]


def greedy(path: Path, prompts: list[list[int]]) -> list[list[int]]:
    model = load_model(path)
    runner = ModelRunner(model, KVCache(model.namespace(4), 256), chunk_size=5)
    return [s.output_ids for s in runner.generate(prompts, SamplingParams(
        max_tokens=NEW_TOKENS, ignore_eos=True))]


def test_config_without_architectures_uses_model_type(tmp_path: Path) -> None:
    d = write_model(tmp_path / "m", "qwen2")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["architectures"]
    (d / "config.json").write_text(json.dumps(cfg))
    model = load_model(d)
    assert model.config.kind == "qwen2"
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    assert greedy(d, prompts) == hf_greedy(d, prompts)


def test_tied_model_saved_under_the_head_name_only(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    d = write_model(tmp_path / "m", "llama", tie=True)
    prompts = [load_model(d).tokenizer.encode(p) for p in PROMPTS]
    want = hf_greedy(d, prompts)
    f = d / "model.safetensors"
    tensors = load_file(str(f))
    tensors["lm_head.weight"] = tensors.pop("model.embed_tokens.weight")
    save_file(tensors, str(f), metadata={"format": "pt"})
    assert greedy(d, prompts) == want


def test_sharded_checkpoint_and_generation_eos(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    d = write_model(tmp_path / "m", "llama")
    prompts = [load_model(d).tokenizer.encode(p) for p in PROMPTS]
    want = hf_greedy(d, prompts)
    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).save_pretrained(
        str(sharded), max_shard_size="100KB")
    assert len(list(sharded.glob("*.safetensors"))) > 2
    (sharded / "tokenizer.json").write_bytes((d / "tokenizer.json").read_bytes())
    gen = json.loads((sharded / "generation_config.json").read_text())
    gen["eos_token_id"] = [1, 7]
    (sharded / "generation_config.json").write_text(json.dumps(gen))
    assert greedy(sharded, prompts) == want
    assert load_model(sharded).eos_token_ids == (1, 7)


@pytest.mark.parametrize("where", ["chat_template.jinja", "chat_template.json",
                                   "tokenizer_config.json"])
@pytest.mark.parametrize("template", [SMOL_STYLE, LOOPS], ids=["chatml", "loops-tojson"])
def test_chat_template_renders_as_transformers(tmp_path: Path, where: str, template: str) -> None:
    from transformers import AutoTokenizer

    d = write_model(tmp_path / "m", "llama")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "eos_token": "</s>"}
    if where == "chat_template.jinja":
        (d / where).write_text(template)
    elif where == "chat_template.json":
        (d / where).write_text(json.dumps({"chat_template": template}))
    else:
        config["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    ours = ChatTemplate.from_dir(d)
    theirs = AutoTokenizer.from_pretrained(str(d))
    # transformers' tokenizer reads the template from .jinja and tokenizer_config.json; a
    # processor's chat_template.json it only renders when given the template
    given = {"chat_template": template} if where == "chat_template.json" else {}
    assert ours.native
    for conversation in CONVERSATIONS:
        assert ours.render(conversation) == theirs.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True, **given)
