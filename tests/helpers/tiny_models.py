"""Tiny random Llama and Qwen2 checkpoints (GQA), written with `transformers` for engine tests.

Each directory has what a real checkpoint has: config.json, model.safetensors,
generation_config.json and a tokenizer.json (a byte-level BPE trained with `tokenizers`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CORPUS = [
    "The KV cache is the centre of the serving system.",
    "Prefill computes the cache; decode reads it block by block.",
    "Storage is traded for computation when prefixes repeat.",
    "Mooncake moves blocks between prefill and decode workers.",
] * 8
PROMPTS = [
    "The KV cache",
    "Prefill computes the cache; decode reads it block by block. Storage is traded",
    "Mooncake moves blocks between prefill and decode workers, and the conductor "
    "decides where each request goes.",
    "a",
]


def write_tokenizer(directory: Path, vocab_size: int = 300) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(str(directory / "tokenizer.json"))


def write_model(directory: Path, kind: str, seed: int = 0, tie: bool = False,
                **overrides: Any) -> Path:
    """Write a tiny random `kind` ("llama", "qwen2" or "mistral") checkpoint into `directory`;
    `overrides` go to the transformers config (e.g. rope_scaling, sliding_window)."""
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    directory.mkdir(parents=True, exist_ok=True)
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  rms_norm_eps=1e-6, tie_word_embeddings=tie, bos_token_id=0, eos_token_id=1)
    common.update(overrides)
    torch.manual_seed(seed)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**{"rope_theta": 10000.0, **common}))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**{"rope_theta": 1000000.0, **common}))
    elif kind == "mistral":
        model = MistralForCausalLM(MistralConfig(**{"sliding_window": 16, **common}))
    else:
        raise ValueError(kind)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    model.save_pretrained(str(directory))
    write_tokenizer(directory)
    return directory
