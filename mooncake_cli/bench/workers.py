"""`mooncake bench workers`: the two figures of the serving workers, measured on real workers over
HTTP on loopback (the prefill worker and the store master in this process, the decode worker in
a child process).

1. Prefix reuse: TTFT (the prefill answer: first token) of a prompt whose leading blocks are in
   the store for `cached_ratio` of its blocks, against the same-length prompt with none cached.
2. Continuous batching: decode tokens/s with `concurrency` requests generating together,
   against requests generated one at a time (prefill excluded from both). Its default model is
   the small `demo`: a decode step of one token is then dominated by fixed per-step costs, as a
   memory-bound decode step is on a GPU. With `demo-25m` on a two-core CPU a 16-token step is
   already compute-bound (its matmuls cost ~6x a 1-token step), which caps the gain near 4x.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from mooncake_cli.bench.stats import Child
from mooncake_cli.config import TransferConfig
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.engine.loader import resolve_dtype
from mooncake_cli.http.jsonhttp import call, events
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.service import MasterService
from mooncake_cli.worker.prefill import PrefillWorker

ALONE = 2  # requests generated one after another in each round of figure 2
Step = Callable[[str], None]  # advances a progress display by one unit, naming the phase


@dataclass(frozen=True)
class BenchWorkersConfig:
    model: str = "demo-25m"  # figure 1
    decode_model: str = "demo"  # figure 2 (see the module docstring)
    device: str = "cpu"
    dtype: str = "float32"
    block_size: int = 16
    chunk_size: int = 512
    prompt_tokens: int = 2048  # figure 1: prompt length
    cached_ratio: float = 0.9  # figure 1: share of the prompt's blocks already stored
    repeats: int = 3  # figure 1: prompts measured each way (median reported)
    concurrency: int = 16  # figure 2: requests decoding together
    decode_prompt: int = 64  # figure 2: prompt tokens per request
    max_tokens: int = 64  # figure 2: tokens each request generates
    seed: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.cached_ratio < 1:
            raise ConfigError(f"cached_ratio must be in (0, 1), got {self.cached_ratio}")
        for name in ("block_size", "chunk_size", "prompt_tokens", "repeats", "concurrency",
                     "decode_prompt", "max_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prompt_tokens < 2 * self.block_size:
            raise ConfigError("prompt_tokens must span at least two blocks")

    def units(self) -> int:
        """Progress units: figure 1's prefills, then figure 2's rounds."""
        return 1 + 5 * self.repeats

    def worker(self, role: str, model: str, **over: Any) -> WorkerConfig:
        return WorkerConfig(role=role, model=model, device=self.device, dtype=self.dtype,
                            block_size=self.block_size, chunk_size=self.chunk_size, **over)


def _block_bytes(cfg: BenchWorkersConfig) -> int:
    """Bytes of one KV block of the model, read from its config (without loading weights)."""
    from mooncake_cli.engine.source import open_source

    mc = open_source(cfg.model).config
    item = torch.empty((), dtype=resolve_dtype(cfg.dtype)).element_size()
    return mc.num_layers * 2 * mc.num_kv_heads * cfg.block_size * mc.head_dim * item


def _prompt(gen: torch.Generator, n: int, vocab: int) -> list[int]:
    return [int(t) for t in torch.randint(0, min(vocab, 256), (n,), generator=gen)]


def _prefill(url: str, rid: str, ids: list[int], decode: str | None = None,
             max_tokens: int = 1) -> tuple[float, dict[str, Any]]:
    t = time.perf_counter()
    answer = call(url + "/v1/prefill", {"request_id": rid, "token_ids": ids, "decode": decode,
                                        "sampling": {"max_tokens": max_tokens,
                                                     "ignore_eos": True}}, timeout=600)
    took = time.perf_counter() - t
    if answer.status != 200:
        raise RuntimeError(f"prefill {rid} failed: {answer.body}")
    return took, answer.body


def prefix_reuse(cfg: BenchWorkersConfig, step: Step) -> dict[str, Any]:
    """Figure 1 (see the module docstring)."""
    blocks = cfg.prompt_tokens // cfg.block_size
    cached = -(-int(cfg.cached_ratio * blocks * 1000) // 1000)  # ceil, robust to 0.9 * 10
    tc = TransferConfig()
    with MasterService(StoreMaster(), "127.0.0.1", 0) as master:
        segment = (blocks + 1) * 2 * (cfg.repeats + 1) * _block_bytes(cfg)
        wcfg = cfg.worker("prefill", cfg.model, store=master.address, kv_blocks=blocks + 2,
                          segment_size=segment)
        with PrefillWorker(wcfg, tc) as worker:
            gen = torch.Generator().manual_seed(cfg.seed)
            vocab = worker.model.config.vocab_size
            _prefill(worker.url, "warmup", _prompt(gen, 2 * cfg.block_size, vocab))
            step("prefix: warm-up")
            cold, warm, hits, parts_cold, parts_warm = [], [], [], [], []
            for r in range(cfg.repeats):
                took, body = _prefill(worker.url, f"cold-{r}",
                                      _prompt(gen, cfg.prompt_tokens, vocab))
                cold.append(took)
                parts_cold.append(body["timing"])
                step("prefix: none cached")
                ids = _prompt(gen, cfg.prompt_tokens, vocab)
                _prefill(worker.url, f"prime-{r}", ids[:cached * cfg.block_size])
                step("prefix: storing the prefix")
                took, body = _prefill(worker.url, f"warm-{r}", ids)
                warm.append(took)
                hits.append(body["cached_tokens"])
                parts_warm.append(body["timing"])
                step("prefix: 90% cached")
            description = worker.model.description
            params = worker.model.config.num_parameters()
    t_cold, t_warm = statistics.median(cold), statistics.median(warm)
    return {"model": description, "parameters": params, "prompt_tokens": cfg.prompt_tokens,
            "blocks": blocks, "cached_blocks": cached, "cached_tokens": hits,
            "ttft_cold_s": cold, "ttft_cached_s": warm, "median_cold_s": t_cold,
            "median_cached_s": t_warm, "ratio": t_warm / t_cold,
            "timing_cold": _median_parts(parts_cold), "timing_cached": _median_parts(parts_warm)}


def _median_parts(parts: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(p[k] for p in parts) for k in parts[0]}


def _generate(url: str, rid: str, ids: list[int], first: int, max_tokens: int) -> int:
    n = 0
    for event in events(url + "/v1/generate",
                        {"request_id": rid, "token_ids": ids, "first_token": first,
                         "sampling": {"max_tokens": max_tokens, "ignore_eos": True}},
                        timeout=600):
        n += "token" in event
    return n


def _decode_child(cfg: BenchWorkersConfig, kv_blocks: int) -> Child:
    """`mooncake decode` in its own process, as in a deployment: the clients' threads here do
    not compete with its step loop for the interpreter lock."""
    return Child([sys.executable, "-m", "mooncake_cli", "--json", "decode", "--model",
                  cfg.decode_model, "--device", cfg.device, "--dtype", cfg.dtype, "--block-size",
                  str(cfg.block_size), "--chunk-size", str(cfg.chunk_size), "--kv-blocks",
                  str(kv_blocks)], "decode worker")


def _steps(url: str) -> int:
    text = call(url + "/metrics").body["text"]
    line = next(x for x in text.splitlines() if x.startswith("mooncake_worker_step_seconds_count"))
    return int(float(line.rsplit(" ", 1)[1]))  # the exposition writes counts as 6.0


def _round(cfg: BenchWorkersConfig, prefill: str, decode: str, prompts: list[list[int]],
           tag: str, together: bool, step: Step) -> tuple[int, float]:
    """Prefill `prompts` into the decode worker, then generate them one after another or all
    at once (released together by a barrier); (tokens, decode seconds)."""
    firsts = [_prefill(prefill, f"{tag}-{i}", p, decode, cfg.max_tokens)[1]["first_token"]
              for i, p in enumerate(prompts)]
    if not together:
        t = time.perf_counter()
        n = sum(_generate(decode, f"{tag}-{i}", p, firsts[i], cfg.max_tokens)
                for i, p in enumerate(prompts))
        step("decode: one at a time")
        return n, time.perf_counter() - t
    counts = [0] * len(prompts)
    gate = threading.Barrier(len(prompts) + 1)

    def run(i: int) -> None:
        gate.wait()
        counts[i] = _generate(decode, f"{tag}-{i}", prompts[i], firsts[i], cfg.max_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for th in threads:
        th.start()
    gate.wait()
    t = time.perf_counter()
    for th in threads:
        th.join()
    step("decode: together")
    return sum(counts), time.perf_counter() - t


def batching(cfg: BenchWorkersConfig, step: Step) -> dict[str, Any]:
    """Figure 2 (see the module docstring). Rounds alternate ALONE requests one at a time with
    `concurrency` at once, so a change in the machine's load hits both; medians are reported."""
    per_request = -(-(cfg.decode_prompt + cfg.max_tokens) // cfg.block_size)
    child = _decode_child(cfg, per_request * cfg.concurrency + 1)
    alone: list[float] = []
    together: list[float] = []
    steps: list[int] = []
    try:
        decode = str(child.line(300)["url"])
        with PrefillWorker(cfg.worker("prefill", cfg.decode_model, kv_blocks=per_request + 1),
                           TransferConfig()) as prefill:
            gen = torch.Generator().manual_seed(cfg.seed + 1)
            vocab = prefill.model.config.vocab_size
            prompts = [_prompt(gen, cfg.decode_prompt, vocab) for _ in range(cfg.concurrency)]
            for r in range(cfg.repeats):
                n, took = _round(cfg, prefill.url, decode, prompts[:ALONE], f"one-{r}", False,
                                 step)
                alone.append(n / took)
                before = _steps(decode)
                n, took = _round(cfg, prefill.url, decode, prompts, f"many-{r}", True, step)
                together.append(n / took)
                steps.append(_steps(decode) - before)
    finally:
        child.close(grace=30)
    rate_alone, rate_together = statistics.median(alone), statistics.median(together)
    return {"model": cfg.decode_model, "requests": cfg.concurrency,
            "prompt_tokens": cfg.decode_prompt,
            "max_tokens": cfg.max_tokens, "tokens_per_s_alone_rounds": alone,
            "tokens_per_s_together_rounds": together, "decode_steps_together": steps,
            "tokens_per_s_alone": rate_alone, "tokens_per_s_together": rate_together,
            "ratio": rate_together / rate_alone}


def run(cfg: BenchWorkersConfig, step: Step) -> dict[str, Any]:
    return {"config": asdict(cfg), "prefix_reuse": prefix_reuse(cfg, step),
            "batching": batching(cfg, step)}
