"""The real SmolLM2-135M-Instruct GGUF (`smollm2-135m`, fetched by scripts/setup.sh) and
transformers' own GGUF loading of the same file, as the reference for exactness tests."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from mooncake_cli.engine import catalog

REPO = Path(__file__).resolve().parents[2]
NAME = "smollm2-135m"
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Name three primary colours."},
     {"role": "assistant", "content": "Red, yellow and blue."},
     {"role": "user", "content": "And the secondary ones?"}],
    [{"role": "user", "content": "Write a haiku about a cache."}],
]
RAW = ["Mooncake is", "The quick brown fox", "def fibonacci(n):\n    ",
       "In 1492, Columbus", "KV cache reuse saves"]


def gguf_path() -> Path:
    m = catalog.CATALOG[NAME]
    if not catalog.is_cached(m):
        pytest.fail(f"{NAME} is not in the cache: run ./scripts/setup.sh "
                    f"(or mooncake models fetch {NAME})")
    return catalog.cached_path(m)


def long_text(tokens: int, tokenizer: Any) -> str:
    """Real prose of at least `tokens` tokens: the project's README."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    words = text.split(" ")
    for n in range(200, len(words), 100):
        chunk = " ".join(words[:n])
        if len(tokenizer.encode(chunk)) >= tokens:
            return chunk
    raise AssertionError("README too short")


class Reference:
    """transformers' AutoModelForCausalLM / AutoTokenizer over the same GGUF file."""

    def __init__(self, path: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        self.model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          dtype=torch.float32)
        self.model.generation_config.eos_token_id = None

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return list(ids["input_ids"] if not isinstance(ids, list) else ids)

    def greedy(self, ids: list[int], new_tokens: int) -> list[int]:
        import torch

        x = torch.tensor([ids])
        y = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, pad_token_id=2)
        return [int(t) for t in y[0, len(ids):]]


NEW = 12
NINETY = "ninety"  # kept out of the store until the 90%-cached test primes it


@dataclass(frozen=True)
class Case:
    name: str
    ids: tuple[int, ...]
    want: tuple[int, ...]


@lru_cache(maxsize=1)
def cases() -> tuple[Case, ...]:
    """12 prompts (4 chats, 5 raw, a 1.1k-token text raw and as two chats) with transformers'
    greedy continuation of NEW tokens; our tokenization is checked against transformers' too."""
    from mooncake_cli.conductor.chat import ChatTemplate
    from mooncake_cli.engine.source import open_source

    src = open_source(NAME)
    ref = Reference(gguf_path())
    chat = ChatTemplate.from_spec(src.chat)
    tok = src.tokenizer
    out: list[Case] = []

    def add(name: str, ids: list[int], want_ids: list[int]) -> None:
        assert ids == want_ids, f"{name}: our prompt tokens differ from transformers'"
        out.append(Case(name, tuple(ids), tuple(ref.greedy(ids, NEW))))

    for i, messages in enumerate(CHATS):
        add(f"chat{i}", tok.encode(chat.render(messages), add_special_tokens=False),
            ref.chat_ids(messages))
    for i, text in enumerate(RAW):
        add(f"raw{i}", tok.encode(text), list(ref.tokenizer(text).input_ids))
    text = long_text(1100, tok)
    add("long-raw", tok.encode(text), list(ref.tokenizer(text).input_ids))
    long_chat = [{"role": "user", "content": "Summarise this:\n" + text}]
    add("long-chat", tok.encode(chat.render(long_chat), add_special_tokens=False),
        ref.chat_ids(long_chat))
    ninety = [{"role": "user", "content": "List the commands named here:\n" + text}]
    add(NINETY, tok.encode(chat.render(ninety), add_special_tokens=False), ref.chat_ids(ninety))
    return tuple(out)
