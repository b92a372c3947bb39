"""Tiny GGUF checkpoints, written with the `gguf` package (llama.cpp's own writer) from the
tiny transformers checkpoints of tiny_models.py, the way llama.cpp's converter lays them out
(q/k rows interleaved for Llama, ggml tensor names, the tokenizer as metadata)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down"}
CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{NAMES[module]}.{kind}"


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permute of q/k rows."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def write_gguf(hf_dir: Path, out: Path, qtype: str = "F32", arch: str | None = None,
               tied_as_output: bool = False) -> Path:
    """`hf_dir` (from tiny_models.write_model) as a GGUF file; 2-D weights in `qtype`."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = arch or cfg["model_type"]
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    w = gguf.GGUFWriter(str(out), arch)
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hidden = cfg["hidden_size"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"])
    if arch == "llama":
        w.add_rope_dimension_count(hidden // heads)
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    special = {t["content"] for t in tok.get("added_tokens", [])}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(True)
    w.add_chat_template(CHAT)
    q = gguf.GGMLQuantizationType[qtype]
    for name, t in tensors.items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings") and not tied_as_output:
            continue
        arr = t.astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            arr = _permute(arr, heads if "q_proj" in name else kv)
        if arr.ndim == 2 and q != gguf.GGMLQuantizationType.F32:
            w.add_tensor(_gguf_name(name), gguf.quants.quantize(arr, q), raw_dtype=q)
        else:
            w.add_tensor(_gguf_name(name), arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
