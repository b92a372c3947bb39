"""`bench kv-wire`: the quality and size cost of int8 KV on the wire against the model's dtype.

Prompts are a long shared prefix (the first `prefix_tokens` tokens, whole blocks, of one of this
package's docs: real prose) followed by one of SUFFIXES. The prefix's KV is computed once, as a
prefill worker would store it; each prompt then runs three ways from it, batched together:

- float: the prefix blocks as computed; the suffix computed, `new_tokens` greedy tokens;
- forced: the prefix blocks through int8 (quantize, dequantize), fed float's tokens, so each
  step's next-token distribution compares with float's at the same position:
  mean KL(float || int8) and the share of steps whose argmax agrees;
- free: the prefix blocks through int8, greedy on its own: the share of prompts whose
  `new_tokens` tokens equal float's, and of all tokens up to the first difference.

Sizes: bytes of a block in the model's dtype and as int8, the time either takes on a link of
`link_gbit` (bytes / rate), and the measured CPU time to quantize and dequantize a block here.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from mooncake_cli.engine.kv_int8 import dequantize, quantize

Progress = Callable[[str], None]
DOCS = ["README.md", "docs/architecture.md", "docs/operations.md", "docs/security.md",
        "docs/indexer.md", "docs/compat.md", "docs/testbed.md", "docs/benchmarks.md"]
SUFFIXES = [
    "\n\nIn one sentence, this text is about",
    "\n\nThe most important command above is",
    "\n\nQuestion: what does the store keep?\nAnswer:",
    "\n\nA short summary for a new user:",
    "\n\nThe word that best describes this design is",
    "\n\nQ: Which component routes requests?\nA:",
    "\n\nTo try it on one machine, first",
    "\n\nThe main limitation mentioned here is",
    "\n\nTranslated into French, the first heading reads",
    "\n\nHere is a list of the files named above:\n1.",
]


@dataclass(frozen=True)
class KVWireBenchConfig:
    model: str = "smollm2-135m"
    dtype: str = "bfloat16"
    threads: int = 2
    prefixes: int = 5
    suffixes: int = 10
    prefix_tokens: int = 1024
    new_tokens: int = 32
    block_size: int = 16
    link_gbit: float = 1.0


def _texts(n: int) -> list[str]:
    root = Path(__file__).resolve().parents[2]
    found = [root / d for d in DOCS if (root / d).is_file()]
    if len(found) < n:
        raise ValueError(f"{n} prefixes asked for, {len(found)} documents found under {root}")
    return [f.read_text(encoding="utf-8") for f in found[:n]]


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row, in nats, of two [rows, vocab] logit tensors."""
    lp = torch.log_softmax(p_logits.float(), dim=-1)
    lq = torch.log_softmax(q_logits.float(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(dim=-1)


def codec_seconds(blocks: torch.Tensor, shape: tuple[int, ...], repeats: int = 3
                  ) -> tuple[float, float]:
    """Best seconds per block to quantize and to dequantize `blocks`."""
    q_best = d_best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        obj = quantize(blocks, shape)
        q_best = min(q_best, time.perf_counter() - t)
        t = time.perf_counter()
        dequantize(obj, shape, blocks.dtype)
        d_best = min(d_best, time.perf_counter() - t)
    return q_best / len(blocks), d_best / len(blocks)


def run(cfg: KVWireBenchConfig, progress: Progress) -> dict[str, Any]:
    from mooncake_cli.engine import KVCache, ModelRunner, SamplingParams, Sequence, load_model
    from mooncake_cli.kvkeys import wire_namespace

    torch.set_num_threads(cfg.threads)
    if not 1 <= cfg.suffixes <= len(SUFFIXES):
        raise ValueError(f"suffixes: 1 to {len(SUFFIXES)}")
    model = load_model(cfg.model, dtype=cfg.dtype)
    tok, bs = model.tokenizer, cfg.block_size
    ns = model.namespace(bs)
    suffixes = [tok.encode(s, add_special_tokens=False) for s in SUFFIXES[:cfg.suffixes]]
    nb = cfg.prefix_tokens // bs
    per_seq = nb + -(-(max(map(len, suffixes)) + cfg.new_tokens) // bs) + 1
    cache = KVCache(ns, nb + 3 * cfg.suffixes * per_seq + 1, model.device)
    runner = ModelRunner(model, cache, chunk_size=max(512, cfg.prefix_tokens))
    greedy = SamplingParams(max_tokens=cfg.new_tokens, temperature=0, ignore_eos=True)
    kls: list[torch.Tensor] = []
    agree = steps = same = prompts = lead = 0
    codec: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    for text in _texts(cfg.prefixes):
        prefix = tok.encode(text)[:nb * bs]
        if len(prefix) < nb * bs:
            raise ValueError(f"a document is shorter than {cfg.prefix_tokens} tokens")
        head = runner.new_sequence(prefix, greedy)
        while head.num_pending:
            runner.step([head])
        blocks = cache.pool[head.block_table].clone()
        runner.release(head)
        through = dequantize(quantize(blocks, ns.block_shape), ns.block_shape, blocks.dtype)
        codec.append(codec_seconds(blocks, ns.block_shape))
        seqs: dict[str, list[Sequence]] = {k: [] for k in ("float", "forced", "free")}
        for suffix in suffixes:
            for kind, kv in (("float", blocks), ("forced", through), ("free", through)):
                s = runner.new_sequence(prefix + suffix, greedy)
                cache.ensure(s.block_table, nb * bs)
                cache.pool[s.block_table[:nb]] = kv
                s.num_computed = nb * bs
                seqs[kind].append(s)
        every = seqs["float"] + seqs["forced"] + seqs["free"]
        n = len(suffixes)
        for _ in range(cfg.new_tokens):
            logits = runner.step(every, [s.num_pending for s in every])
            fl, fo = logits[:n], logits[n:2 * n]
            kls.append(_kl(fl, fo))
            agree += int((fl.argmax(-1) == fo.argmax(-1)).sum())
            steps += n
            got = runner.sampler(logits, [s.params for s in every],
                                 [s.generator for s in every])
            for i, s in enumerate(every):  # forced rows take float's token
                s.token_ids.append(got[i - n] if n <= i < 2 * n else got[i])
        for f, free in zip(seqs["float"], seqs["free"], strict=True):
            a, b = f.output_ids, free.output_ids
            same += a == b
            lead += next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
            prompts += 1
        for s in every:
            runner.release(s)
        progress(f"{prompts} prompts done ({time.perf_counter() - t0:.0f} s)")
    kl = torch.cat(kls)
    native = ns.block_bytes
    wire = wire_namespace(ns, "int8").block_bytes
    q_s = sum(c[0] for c in codec) / len(codec)
    d_s = sum(c[1] for c in codec) / len(codec)
    rate = cfg.link_gbit * 1e9 / 8
    return {
        "model": cfg.model, "dtype": cfg.dtype, "threads": cfg.threads, "prompts": prompts,
        "prefix_tokens": nb * bs, "new_tokens": cfg.new_tokens, "block_size": bs,
        "utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "quality": {"mean_kl_nats": float(kl.mean()), "max_kl_nats": float(kl.max()),
                    "p99_kl_nats": float(kl.quantile(0.99)),
                    "forced_top1_agreement": agree / steps,
                    "free_exact_prompts": same / prompts,
                    "free_tokens_before_divergence": lead / (prompts * cfg.new_tokens)},
        "size": {"native_block_bytes": native, "int8_block_bytes": wire,
                 "ratio": wire / native, "link_gbit": cfg.link_gbit,
                 "native_link_ms": native / rate * 1e3, "int8_link_ms": wire / rate * 1e3,
                 "quantize_ms": q_s * 1e3, "dequantize_ms": d_s * 1e3,
                 "int8_total_ms": (wire / rate + q_s + d_s) * 1e3},
        "seconds": round(time.perf_counter() - t0, 1)}
