"""ServedModel: what the conductor knows of the model it serves (no weights)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mooncake_cli.conductor.chat import ChatTemplate
from mooncake_cli.kvkeys import KVNamespace


@dataclass(frozen=True)
class ServedModel:
    """What the conductor needs of the model: its name, tokenizer, KV namespace, context and
    vocabulary size (token ids of a prompt must be below it)."""

    name: str
    tokenizer: Any  # encode(str, add_special_tokens) -> list[int], decode(list[int]) -> str
    ns: KVNamespace
    max_context: int
    chat: ChatTemplate = field(default_factory=lambda: ChatTemplate(None))
    vocab_size: int | None = None
    eos_token_ids: tuple[int, ...] = ()  # end an answer unless a request ignores them

    def chat_tokens(self, messages: tuple[dict[str, str], ...]) -> list[int]:
        """The prompt of a chat request: the model's template when it has one (its special
        tokens written by the template), else the plain rendering."""
        text = self.chat.render(messages)
        return list(self.tokenizer.encode(text, add_special_tokens=not self.chat.native))
