"""`bench model`: our engine against transformers' `generate` on the same weights, dtype and
threads, in one process, plus the machine's memory-bandwidth limit measured in the same run.

Figures (each ours ÷ theirs): single-stream decode tokens/s; aggregate decode tokens/s of
`concurrency` requests (ours: one continuous batch; theirs: one padded batched `generate`), all
asking for the same count, and asking for different counts (1/N ... N/N of it: a batched
`generate` runs every row to the longest, ours lets each leave when done; tokens/s counts the
tokens the requests asked for);
TTFT of a long prompt (prefill + first token); and, in a child process, peak RSS while loading
the checkpoint against the size of its dequantized weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mooncake_cli.engine.errors import ModelError

Progress = Callable[[str], None]
SEEDS = ["Mooncake is", "The quick brown fox", "In 1492, Columbus", "KV cache reuse",
         "def fibonacci(n):", "The capital of France", "Once upon a time", "Storage is cheaper",
         "A decode step reads", "Prefill computes", "The conductor picks", "Tokens per second",
         "Hello, my name is", "Paged attention", "The store keeps", "Why is the sky blue?"]


@dataclass(frozen=True)
class ModelBenchConfig:
    model: str = "smollm2-135m"
    dtype: str = "float32"
    threads: int = 2
    tokens: int = 64
    concurrency: int = 16
    prompt_tokens: int = 2048
    repeats: int = 2


def memcpy_gbps(size: int = 256 << 20, repeats: int = 5) -> float:
    """Single-thread numpy memcpy bandwidth (bytes copied per second), best of `repeats`."""
    src = np.ones(size, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return size / best / 1e9


class Ours:
    def __init__(self, cfg: ModelBenchConfig) -> None:
        from mooncake_cli.engine import KVCache, ModelRunner, load_model

        self.model = load_model(cfg.model, dtype=cfg.dtype)
        blocks = (cfg.prompt_tokens + cfg.tokens * 2) // 16 + \
            cfg.concurrency * (-(-(32 + cfg.tokens) // 16) + 1) + 8
        self.runner = ModelRunner(self.model, KVCache(self.model.namespace(16), blocks),
                                  chunk_size=max(512, cfg.prompt_tokens))

    def decode_s(self, prompts: list[list[int]], tokens: int | list[int]) -> float:
        """Seconds from every first token to every last (prefill excluded); `tokens` per
        request, or one count for all."""
        from mooncake_cli.engine import SamplingParams

        r = self.runner
        counts = tokens if isinstance(tokens, list) else [tokens] * len(prompts)
        seqs = [r.new_sequence(p, SamplingParams(max_tokens=n, ignore_eos=True))
                for p, n in zip(prompts, counts, strict=True)]
        for s in seqs:
            r.prefill(s)
        t = time.perf_counter()
        r.run_to_completion(seqs)
        return time.perf_counter() - t

    def ttft_s(self, ids: list[int]) -> float:
        from mooncake_cli.engine import SamplingParams

        seq = self.runner.new_sequence(ids, SamplingParams(max_tokens=1))
        t = time.perf_counter()
        self.runner.prefill(seq)
        dt = time.perf_counter() - t
        self.runner.release(seq)
        return dt


class Theirs:
    """transformers' AutoModelForCausalLM on the same checkpoint (a GGUF through `gguf_file`)."""

    def __init__(self, cfg: ModelBenchConfig, source: Any) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                 "float16": torch.float16}[cfg.dtype]
        path = source.path
        if path is None:
            raise ModelError(f"bench model needs a checkpoint transformers can load, not "
                             f"{cfg.model!r}")
        if path.is_file():
            self.model = AutoModelForCausalLM.from_pretrained(str(path.parent),
                                                              gguf_file=path.name, dtype=dtype)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        self.model.generation_config.eos_token_id = None

    def _generate(self, prompts: list[list[int]], tokens: int) -> float:
        import torch

        width = max(len(p) for p in prompts)
        x = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        t = time.perf_counter()
        self.model.generate(x, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                            do_sample=False, pad_token_id=0)
        return time.perf_counter() - t

    def decode_s(self, prompts: list[list[int]], tokens: int | list[int]) -> float:
        """generate(tokens) minus generate(1): the decode part, as for ours. A batched
        generate runs every row to the longest request's count."""
        most = max(tokens) if isinstance(tokens, list) else tokens
        return self._generate(prompts, most) - self._generate(prompts, 1)

    def ttft_s(self, ids: list[int]) -> float:
        return self._generate([ids], 1)


def run(cfg: ModelBenchConfig, say: Progress) -> dict[str, Any]:
    import torch

    from mooncake_cli.engine.source import open_source

    torch.set_num_threads(cfg.threads)
    say("measuring memcpy bandwidth ...")
    bw = memcpy_gbps()
    say("measuring peak RSS while loading (child process) ...")
    rss = load_rss(cfg)
    say(f"loading {cfg.model} (ours) ...")
    ours = Ours(cfg)
    tok = ours.model.tokenizer
    prompts = [tok.encode(SEEDS[i % len(SEEDS)]) for i in range(cfg.concurrency)]
    long_ids = _long_prompt(tok, cfg.prompt_tokens)
    say("loading transformers' model on the same checkpoint ...")
    theirs = Theirs(cfg, open_source(cfg.model))
    weight_bytes = _weight_bytes(ours.model)
    n = cfg.tokens - 1
    mixed = [max(2, cfg.tokens * (i + 1) // cfg.concurrency) for i in range(cfg.concurrency)]
    engines: dict[str, Any] = {"ours": ours, "transformers": theirs}
    for e in engines.values():
        e.decode_s(prompts[:1], 4)  # warm up
    best: dict[str, dict[str, float]] = {k: {} for k in engines}
    # Interleaved (ours, theirs, ours, theirs ...), best of `repeats`: on a shared machine a
    # burst of load then hits both sides alike.
    figures: list[tuple[str, str, Callable[[Any], float]]] = [
        ("single", f"single stream, {cfg.tokens} tokens",
         lambda e: e.decode_s(prompts[:1], cfg.tokens)),
        ("batch", f"{cfg.concurrency} concurrent requests",
         lambda e: e.decode_s(prompts, cfg.tokens)),
        ("mixed", f"{cfg.concurrency} concurrent requests of {min(mixed)}-{max(mixed)} tokens",
         lambda e: e.decode_s(prompts, mixed)),
        ("ttft", f"TTFT of a {len(long_ids)}-token prompt", lambda e: e.ttft_s(long_ids))]
    for key, what, fn in figures:
        for i in range(cfg.repeats):
            for name, e in engines.items():
                say(f"{what}: {name} ({i + 1}/{cfg.repeats}) ...")
                dt = fn(e)
                best[name][key] = min(best[name].get(key, float("inf")), dt)
    rows = {name: {"single_tok_s": n / b["single"],
                   "batch_tok_s": cfg.concurrency * n / b["batch"],
                   "mixed_tok_s": sum(m - 1 for m in mixed) / b["mixed"], "ttft_s": b["ttft"]}
            for name, b in best.items()}
    o, t = rows["ours"], rows["transformers"]
    limit = bw * 1e9 / weight_bytes
    return {
        "model": cfg.model, "description": ours.model.description, "dtype": cfg.dtype,
        "threads": cfg.threads, "tokens": cfg.tokens, "concurrency": cfg.concurrency,
        "mixed_tokens": mixed, "prompt_tokens": len(long_ids), "weight_bytes": weight_bytes,
        "memcpy_gbps": bw,
        "bandwidth_limit_tok_s": limit, "ours": o, "transformers": t,
        "ratios": {"single": o["single_tok_s"] / t["single_tok_s"],
                   "batch": o["batch_tok_s"] / t["batch_tok_s"],
                   "mixed": o["mixed_tok_s"] / t["mixed_tok_s"],
                   "ttft": o["ttft_s"] / t["ttft_s"],
                   "single_of_limit": o["single_tok_s"] / limit},
        "load": rss,
    }


def _weight_bytes(model: Any) -> int:
    """Bytes of weights a decode step reads (a tied head counted once)."""
    w = model.transformer.w
    seen: set[int] = set()
    total = 0
    tensors = [w.norm, w.lm_head, *[t for layer in w.layers for t in vars(layer).values()
                                    if t is not None]]
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def _long_prompt(tok: Any, n: int) -> list[int]:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md")
    words = text.read_text(encoding="utf-8").split() if text.is_file() else SEEDS * 200
    ids: list[int] = []
    while len(ids) < n:
        ids += tok.encode(" ".join(words))
    return ids[:n]


_RSS_CHILD = """
import json, os, resource, sys, torch
torch.set_num_threads(int(sys.argv[3]))
from mooncake_cli.engine import load_model
from mooncake_cli.engine.source import open_source
open_source(sys.argv[1])  # fetched, tokenizer built: not part of the weights' peak
before = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
m = load_model(sys.argv[1], dtype=sys.argv[2])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
from mooncake_cli.bench.model import _weight_bytes
print(json.dumps({"before": before, "peak": peak, "weights": _weight_bytes(m)}))
"""


def load_rss(cfg: ModelBenchConfig) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _RSS_CHILD, cfg.model, cfg.dtype,
                           str(cfg.threads)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise ModelError(f"loading {cfg.model} in a child failed: "
                         f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
    r = json.loads(done.stdout.strip().splitlines()[-1])
    r["growth_ratio"] = max(0, r["peak"] - r["before"]) / r["weights"]
    r["peak_ratio"] = r["peak"] / r["weights"]
    return dict(r)
