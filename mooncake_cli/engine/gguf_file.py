"""GGUF checkpoints (llama.cpp's format): metadata -> config, tensors dequantized one at a time.

    ckpt = GGUFCheckpoint(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))
    ckpt.config_dict()              # a Hugging Face-style config.json dict
    for name, t in ckpt.tensors():  # Hugging Face names, float32 CPU tensors, streamed
        ...

Every quantisation type the `gguf` package dequantizes is read (Q4_0 ... Q8_0, K-quants, IQ,
BF16, F16, F32). llama.cpp interleaves the rows of Llama/Mistral q and k projections for its RoPE;
they are put back in Hugging Face order here. Truncated or corrupt files, unknown architectures
and unsupported tensor types are one ModelError naming the file and what is wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mooncake_cli.engine import models
from mooncake_cli.engine.errors import ModelError

MAGIC = b"GGUF"
_LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
              "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def hf_name(name: str) -> str | None:
    """The Hugging Face name of GGUF tensor `name` (None for tensors we do not use)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row interleaving (its convert_hf_to_gguf `permute`)."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFCheckpoint:
    """One `.gguf` file, opened memory-mapped; nothing is dequantized until `tensors()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.is_file():
            raise ModelError(f"{path}: no such file")
        with path.open("rb") as f:
            head = f.read(4)
        if head != MAGIC:
            raise ModelError(f"{path}: not a GGUF file (magic {head!r}, expected {MAGIC!r})")
        try:
            from gguf import GGUFReader
        except ImportError:
            raise ModelError("reading .gguf files needs the gguf package: "
                             "pip install 'mooncake-cli[models]'") from None
        try:
            self._reader = GGUFReader(str(path))
        except (ValueError, IndexError, OSError, EOFError) as e:
            raise ModelError(f"{path}: truncated or corrupt GGUF ({e})") from None
        self.meta = {k: _value(f) for k, f in self._reader.fields.items()}
        end = max((t.data_offset + t.n_bytes for t in self._reader.tensors), default=0)
        size = path.stat().st_size
        if end > size:
            raise ModelError(f"{path}: truncated GGUF: tensor data ends at byte {end}, the file "
                             f"has {size}")
        arch = str(self.meta.get("general.architecture"))
        family = models.BY_GGUF.get(arch)
        if family is None:
            raise ModelError(f"{path}: unsupported architecture {arch!r} (supported GGUF "
                             f"architectures: {', '.join(models.BY_GGUF)})")
        self.family = family
        self.arch = arch
        self._check_types()

    def _check_types(self) -> None:
        from gguf import GGMLQuantizationType as Q
        from gguf import quants

        for t in self._reader.tensors:
            ok = t.tensor_type in (Q.F32, Q.F16) or quants._type_traits.get(t.tensor_type)
            if not ok:
                raise ModelError(f"{self.path}: tensor {t.name} has quantisation type "
                                 f"{t.tensor_type.name}, which cannot be dequantized (gguf "
                                 f"{_gguf_version()})")
            if t.name == "rope_freqs.weight":
                raise ModelError(f"{self.path}: per-frequency RoPE factors (rope_freqs.weight, "
                                 "Llama 3.1 long context) are not supported yet")

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(f"{self.arch}.{key}", default)

    def config_dict(self) -> dict[str, Any]:
        """The model's configuration as Hugging Face's config.json spells it."""
        heads = self.get("attention.head_count")
        hidden = self.get("embedding_length")
        names = {t.name for t in self._reader.tensors}
        raw: dict[str, Any] = {
            "architectures": [self.family.hf_classes[0]], "model_type": self.family.name,
            "hidden_size": hidden, "num_hidden_layers": self.get("block_count"),
            "intermediate_size": self.get("feed_forward_length"),
            "num_attention_heads": heads,
            "num_key_value_heads": self.get("attention.head_count_kv", heads),
            "rms_norm_eps": self.get("attention.layer_norm_rms_epsilon", 1e-6),
            "rope_theta": self.get("rope.freq_base", 10000.0),
            "max_position_embeddings": self.get("context_length", 4096),
            "vocab_size": self.get("vocab_size") or len(self.meta.get("tokenizer.ggml.tokens")
                                                         or ()),
            "tie_word_embeddings": "output.weight" not in names,
            "eos_token_id": self.meta.get("tokenizer.ggml.eos_token_id"),
            "bos_token_id": self.meta.get("tokenizer.ggml.bos_token_id"),
            "hidden_act": "silu",
        }
        dim = self.get("rope.dimension_count")
        if dim and self.family.gguf_permutes_qk:
            raw["head_dim"] = dim
        window = self.get("attention.sliding_window")
        if window:
            raw["sliding_window"] = window
        scaling = self.get("rope.scaling.type")
        if scaling and scaling != "none":
            raw["rope_scaling"] = {"rope_type": scaling,
                                   "factor": self.get("rope.scaling.factor", 1.0)}
        missing = [k for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                               "num_attention_heads") if raw[k] is None]
        if missing:
            raise ModelError(f"{self.path}: GGUF metadata lacks {self.arch}.* keys for "
                             f"{', '.join(missing)}")
        return raw

    def eos_ids(self) -> tuple[int, ...]:
        """End-of-sequence ids: eos plus end-of-turn tokens (eot, eom) where the file names them."""
        keys = ("eos", "eot", "eom")
        ids = [self.meta.get(f"tokenizer.ggml.{k}_token_id") for k in keys]
        return tuple(dict.fromkeys(int(i) for i in ids if i is not None))

    @property
    def num_tensors(self) -> int:
        return len(self._reader.tensors)

    def tensors(self) -> Iterator[tuple[str, Any]]:
        """(Hugging Face name, float32 CPU torch tensor), one tensor dequantized at a time."""
        import torch
        from gguf import quants

        cfg = self.config_dict()
        heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        for t in self._reader.tensors:
            name = hf_name(t.name)
            if name is None:
                continue
            try:
                w = quants.dequantize(t.data, t.tensor_type)
            except (ValueError, NotImplementedError) as e:
                raise ModelError(f"{self.path}: tensor {t.name} ({t.tensor_type.name}): {e}") \
                    from None
            w = np.asarray(w, dtype=np.float32)
            if self.family.gguf_permutes_qk and name.endswith(("q_proj.weight", "k_proj.weight")):
                w = unpermute(w, heads if "q_proj" in name else kv_heads)
            w = np.ascontiguousarray(w)
            w = w if w.flags.writeable else w.copy()
            self._drop_pages(t.data_offset, t.n_bytes)
            yield name, torch.from_numpy(w)

    def _drop_pages(self, offset: int, length: int) -> None:
        """Let the kernel drop the file pages of a tensor already dequantized, so the mapped
        file does not add to the load's peak memory (the page cache keeps them)."""
        import mmap

        mm = getattr(self._reader.data, "_mmap", None)
        page = mmap.PAGESIZE
        start = offset // page * page
        if mm is None or not hasattr(mm, "madvise"):
            return
        try:
            mm.madvise(mmap.MADV_DONTNEED, start, min(len(mm), offset + length) - start)
        except (OSError, ValueError):  # advice only
            pass


def _value(field: Any) -> Any:
    from gguf import GGUFValueType

    try:
        return field.contents()
    except (ValueError, IndexError, UnicodeDecodeError):
        return None if field.types and field.types[0] != GGUFValueType.ARRAY else []


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "?"
