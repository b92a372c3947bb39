"""A GGUF file's tokenizer, rebuilt with the `tokenizers` library from llama.cpp's metadata.

A GGUF stores the vocabulary (`tokenizer.ggml.tokens`), merges, token types and special ids, not
a `tokenizer.json`. Two kinds are rebuilt, as transformers rebuilds them from the same keys:
`gpt2` (byte-level BPE; the split regex follows `tokenizer.ggml.pre`) and `llama` (SentencePiece
BPE with byte fallback). Control tokens (type 3) become special tokens, user-defined ones (type
4) added tokens, so both stay whole in the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from mooncake_cli.engine.errors import ModelError

CONTROL, USER_DEFINED = 3, 4

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "smaug-bpe": _LLAMA3,
          "dbrx": _LLAMA3, "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2}


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the alphabet of byte-level vocabularies)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars, strict=True)}


def build_tokenizer(meta: dict[str, Any], source: str) -> Any:
    """A `tokenizers.Tokenizer` for the GGUF metadata `meta` (keys as in the file)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    kind = meta.get("tokenizer.ggml.model")
    tokens: Sequence[str] | None = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelError(f"{source}: no tokenizer in the GGUF metadata (tokenizer.ggml.tokens)")
    types: Sequence[int] = meta.get("tokenizer.ggml.token_type") or ()
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or ()]
    if kind == "gpt2":
        alphabet = set(_byte_alphabet().values())
        spell = _byte_alphabet()
        vocab = {t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8")): i
                 for i, t in enumerate(tokens)}
        tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                            end_of_word_suffix="", fuse_unk=False))
        split = SPLITS.get(str(meta.get("tokenizer.ggml.pre")))
        if split is None:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        control_ok = alphabet
        add_bos_default = False
    elif kind == "llama":
        vocab = {t: i for i, t in enumerate(tokens)}
        if not merges:
            raise ModelError(f"{source}: a SentencePiece GGUF without tokenizer.ggml.merges is "
                             "not supported")
        tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                            dropout=None, unk_token=_token(meta, tokens, "unknown")))
        prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first" if prefix else "never", split=False)
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        if prefix:
            steps.append(decoders.Strip(content=" ", left=1))
        tok.decoder = decoders.Sequence(steps)
        control_ok = None
        add_bos_default = True
    else:
        raise ModelError(f"{source}: tokenizer type {kind!r} is not supported (supported: gpt2 "
                         "byte-level BPE, llama SentencePiece BPE)")
    special = [AddedToken(t, normalized=False, special=True)
               for t, ty in zip(tokens, types, strict=False)
               if ty == CONTROL and (control_ok is None or set(t) <= control_ok)]
    if special:
        tok.add_special_tokens(special)
    added = [AddedToken(t, normalized=False, special=False)
             for t, ty in zip(tokens, types, strict=False) if ty == USER_DEFINED]
    if added:
        tok.add_tokens(added)
    bos = _token(meta, tokens, "bos")
    if bos is not None and meta.get("tokenizer.ggml.add_bos_token", add_bos_default):
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, int(meta["tokenizer.ggml.bos_token_id"]))])
    return tok


def _token(meta: dict[str, Any], tokens: Sequence[str], which: str) -> str | None:
    i = meta.get(f"tokenizer.ggml.{which}_token_id")
    return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None


def special_token(meta: dict[str, Any], which: str) -> str:
    """The text of the bos/eos token (for chat templates), or ""."""
    return _token(meta, meta.get("tokenizer.ggml.tokens") or (), which) or ""
