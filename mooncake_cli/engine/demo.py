"""Built-in demo models: random weights from a fixed seed and a byte tokenizer.

They run the whole system with no download. Their output is MEANINGLESS text: the weights are
random. `demo` is small and quick; `demo-25m` (~25M parameters) is big enough that compute
dominates on a CPU, for prefix-reuse and profile benchmarks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mooncake_cli.engine.model_config import ModelConfig
from mooncake_cli.engine.tokenizer import ByteTokenizer

if TYPE_CHECKING:  # torch loads only where tensors are made
    import torch

SEED = 20240601
LABEL = "random weights (seed {seed}): generates meaningless text"


def _config(hidden: int, layers: int, heads: int, kv_heads: int, inter: int) -> ModelConfig:
    return ModelConfig(architecture="LlamaForCausalLM", vocab_size=320, hidden_size=hidden,
                       intermediate_size=inter, num_layers=layers, num_heads=heads,
                       num_kv_heads=kv_heads, head_dim=hidden // heads, rms_norm_eps=1e-6,
                       rope_theta=10000.0, max_position=8192, tie_word_embeddings=False,
                       eos_token_ids=(ByteTokenizer.EOS,), bos_token_id=ByteTokenizer.BOS)


DEMOS = {
    "demo": _config(hidden=128, layers=4, heads=4, kv_heads=2, inter=352),
    "demo-25m": _config(hidden=512, layers=8, heads=8, kv_heads=4, inter=1408),
}


def demo_tensors(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Hugging Face-named float32 tensors for `cfg`, drawn from a generator seeded with SEED."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    h, d = cfg.hidden_size, cfg.head_dim

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * (shape[-1] ** -0.5)

    out = {"model.embed_tokens.weight": torch.randn((cfg.vocab_size, h), generator=gen),
           "model.norm.weight": torch.ones(h), "lm_head.weight": rand(cfg.vocab_size, h)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
            p + "self_attn.q_proj.weight": rand(cfg.num_heads * d, h),
            p + "self_attn.k_proj.weight": rand(cfg.num_kv_heads * d, h),
            p + "self_attn.v_proj.weight": rand(cfg.num_kv_heads * d, h),
            p + "self_attn.o_proj.weight": rand(h, cfg.num_heads * d),
            p + "mlp.gate_proj.weight": rand(cfg.intermediate_size, h),
            p + "mlp.up_proj.weight": rand(cfg.intermediate_size, h),
            p + "mlp.down_proj.weight": rand(h, cfg.intermediate_size),
        })
    return out
