"""Tokenizers: the `tokenizers` package (a `tokenizer.json`, or one rebuilt from GGUF metadata)
or the demo's bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from mooncake_cli.engine.errors import ModelError


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


class HFTokenizer:
    """`tokenizer.json` through the `tokenizers` package; encode adds the model's special tokens."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as Impl

        if not path.is_file():
            raise ModelError(f"{path} not found: a model directory needs tokenizer.json "
                             "(the fast-tokenizer file transformers writes)")
        try:
            self._tok: Any = Impl.from_file(str(path))
        except Exception as e:  # the Rust side raises a plain Exception
            raise ModelError(f"{path}: cannot load tokenizer ({e})") from None

    @classmethod
    def from_object(cls, tok: object) -> HFTokenizer:
        """Wrap an already built `tokenizers.Tokenizer` (e.g. one rebuilt from GGUF metadata)."""
        self = cls.__new__(cls)
        self._tok = tok
        return self

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def token_id(self, token: str) -> int | None:
        found = self._tok.token_to_id(token)
        return None if found is None else int(found)


class ByteTokenizer:
    """The demo's tokenizer: one token per UTF-8 byte (0-255), then <bos> 256 and <eos> 257."""

    BOS = 256
    EOS = 257
    VOCAB = 258

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [self.BOS, *text.encode("utf-8")] if add_special_tokens else \
            list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
