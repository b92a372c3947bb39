"""`mooncake bench pipeline`: TTFT of a prompt prefilled by one instance against the same prompt
prefilled as a pipeline across 2 or 3 instances (`PrefillRequest.pipeline`: the worker asked
leads, the layers split evenly, the prompt handed on in `chunk` token chunks).

All instances are `mooncake prefill` processes with the same `--threads` (bench/pipeline_procs.py);
worker 0 answers every request, alone (1 stage) or leading workers 1.. (2, 3 stages). TTFT is
the wall time of the POST /v1/prefill call. Prompts are real text: windows of the project's docs
(or, where they are not installed, of its sources), tokenized by the model's tokenizer, one
distinct window per prompt length and repeat, sent with reuse "none". Each repeat runs every
stage count on the same prompt, the order rotated from one repeat to the next, so that drifts
of the host's load fall on all stage counts alike and the first tokens can be compared.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mooncake_cli.bench.pipeline_procs import PrefillProcs
from mooncake_cli.bench.pipeline_summary import summarize
from mooncake_cli.engine.source import open_source
from mooncake_cli.engine.stages import split_layers
from mooncake_cli.interfaces import ConfigError

Step = Callable[[str], None]  # advances the progress display by one unit, naming what ran
WARMUP_TOKENS = 256  # the warm-up prefill: first requests pay one-off allocations


@dataclass(frozen=True)
class PipelineBenchConfig:
    model: str = "smollm2-135m"
    tokens: tuple[int, ...] = (2048, 4096, 8190)  # 8190 as "8k": prompts must be < 8192 positions
    stages: tuple[int, ...] = (1, 2, 3)
    repeat: int = 2
    chunk: int = 512  # tokens per pipeline chunk, and the workers' --chunk-size
    threads: int = 1
    block_size: int = 16
    timeout: float = 1800.0  # seconds one prefill may take

    def __post_init__(self) -> None:
        if not self.tokens or min(self.tokens) < 1:
            raise ConfigError("--tokens: give prompt lengths >= 1, e.g. 2048,4096,8190")
        if 1 not in self.stages or min(self.stages) < 1 or max(self.stages) > 8:
            raise ConfigError("--stages: give stage counts in 1..8, 1 among them (the "
                              "single instance every row is compared with), e.g. 1,2,3")
        for name in ("repeat", "chunk", "threads", "block_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be >= 1, got {getattr(self, name)}")

    def units(self) -> int:
        """Progress units: starting the workers, the warm-up, then one per prefill."""
        return 2 + len(self.tokens) * self.repeat * len(self.stages)


def corpus(tokenize: Callable[[str], list[int]]) -> tuple[list[int], str]:
    """The token ids the prompts are cut from, and where their text came from."""
    root = Path(__file__).resolve().parents[2]
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    if all(p.is_file() for p in docs[:2]):
        files, source = docs, "README.md and docs/*.md"
    else:  # an installed package: its own sources are text too
        files, source = sorted((root / "mooncake_cli").rglob("*.py")), "mooncake_cli/**/*.py"
    ids = tokenize("\n\n".join(p.read_text(encoding="utf-8") for p in files))
    return ids, source


def window(ids: list[int], n: int, k: int) -> list[int]:
    """The `k`-th distinct `n`-token prompt cut from `ids` (taken round and round)."""
    start = (k * 7919) % len(ids)  # a prime stride: distinct starts for len(ids) > k
    laps = math.ceil((start + n) / len(ids))
    return (ids * laps)[start:start + n]


def _one(procs: PrefillProcs, cfg: PipelineBenchConfig, rid: str, ids: list[int],
         stages: int) -> dict[str, Any]:
    body: dict[str, Any] = {"request_id": rid, "token_ids": ids, "reuse": "none"}
    if stages > 1:
        body["pipeline"] = {"stages": procs.urls[1:stages], "chunk_tokens": cfg.chunk}
    cpu = procs.cpu()
    t0 = time.perf_counter()
    ans = procs.prefill(0, body, cfg.timeout)
    ttft = time.perf_counter() - t0
    pipe = ans.get("pipeline") or {}
    return {"ttft_s": round(ttft, 4), "first_token": ans["first_token"],
            "server_total_s": ans.get("timing", {}).get("total"),
            "busy_cores": round((procs.cpu() - cpu) / ttft, 2),
            **{f"{k}_s": pipe.get(k, 0.0) for k in ("begin", "handoff", "drain")},
            "bytes_sent": pipe.get("bytes_sent", 0), "fallback": pipe.get("fallback", ""),
            "layers": pipe.get("layers") or [], "worker_warnings": procs.warnings()}


def _load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the platform has none)."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def _host(load: list[float] | None) -> dict[str, Any]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cores": cores, "machine": platform.machine(), "python": platform.python_version(),
            "load_before": load, "load_after": _load()}


def run(cfg: PipelineBenchConfig, step: Step) -> dict[str, Any]:
    """Start the workers, warm them up, measure every (prompt length, stage count) `repeat`
    times; the report (see bench/pipeline_summary.py for its rows)."""
    src = open_source(cfg.model)
    layers = src.config.num_layers
    if max(cfg.tokens) >= src.config.max_position:
        raise ConfigError(f"--tokens: {cfg.model} has {src.config.max_position} positions; "
                          f"prompts must be shorter (e.g. {src.config.max_position - 2})")
    if max(cfg.stages) > layers:
        raise ConfigError(f"--stages: {cfg.model} has only {layers} layers")
    ids, source = corpus(lambda text: src.tokenizer.encode(text, add_special_tokens=False))
    load = _load()
    began = time.perf_counter()
    kv_blocks = math.ceil(max(cfg.tokens) / cfg.block_size) + 1
    samples: dict[tuple[int, int], list[dict[str, Any]]] = {}
    with PrefillProcs(max(cfg.stages), cfg.model, cfg.threads, kv_blocks, cfg.chunk,
                      cfg.block_size) as procs:
        step("warming up")
        t = time.perf_counter()
        warm = window(ids, WARMUP_TOKENS, 0)  # every stage count once: every worker runs
        for s in sorted(set(cfg.stages)):
            _one(procs, cfg, f"warmup-{s}", warm, s)
        warmup = time.perf_counter() - t
        step("measuring")
        k = 1
        for n in cfg.tokens:
            for r in range(cfg.repeat):
                prompt = window(ids, n, k)
                k += 1
                turn = r % len(cfg.stages)
                for s in cfg.stages[turn:] + cfg.stages[:turn]:
                    got = _one(procs, cfg, f"p{n}-r{r}-s{s}", prompt, s)
                    samples.setdefault((n, s), []).append({"repeat": r, **got})
                    step(f"{n} tokens, {s} stage(s)")
    ranges = {s: [[r.start, r.stop] for r in split_layers(layers, s)] for s in cfg.stages}
    return {"model": src.description, "layers": layers, "threads": cfg.threads,
            "chunk_tokens": cfg.chunk, "repeat": cfg.repeat, "tokens": list(cfg.tokens),
            "stages": list(cfg.stages), "prompt_source": source, "corpus_tokens": len(ids),
            "host": _host(load), "warmup_s": round(warmup, 2),
            "elapsed_s": round(time.perf_counter() - began, 1),
            **summarize(samples, ranges, layers)}
