"""`mooncake bench trace --simulate`: the scheduler against simulated instances."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from mooncake_cli.commands import bench_plot
from mooncake_cli.config import load
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out, ProgressBars
from mooncake_cli.sim.run import simulate
from mooncake_cli.sim.settings import SimConfig
from mooncake_cli.sim.trace import DEFAULT_TRACE


def _f(x: Any, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _human(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        s = rep["setup"]
        t = Table(title=f"bench trace --simulate: {rep['requests']} requests, {rep['model']}; "
                        f"{s['prefill']} prefill + {s['decode']} decode instances, cache "
                        f"{s['cache_tokens']} tokens each, timestamps / {s['time_scale']:g}",
                  title_justify="left", box=box.SIMPLE_HEAD, caption_justify="left",
                  caption="TTFT: mean and percentiles, s; TBT: a request's mean of its longest "
                          "10% token gaps, s; hit: input tokens reused; ≤X: requests served "
                          f"with TTFT <= {s['ttft_threshold']:g} s and TBT <= X; µs: "
                          "scheduling time per request, p50")
        limits = [f"{float(x) * 1e3:g}ms" for x in s["tbt_thresholds"].split(",")]
        cols = ["row", "TTFT", "p50", "p90", "p99", "TBTp99", "hit", "429",
                *(f"≤{x}" for x in limits), "µs"]
        for c in cols:
            t.add_column(c, justify="left" if c == "row" else "right", no_wrap=True)
        for group in ("policies", "baselines"):
            for name, r in rep[group].items():
                tt, tb, cap = r["ttft_s"], r["tbt_s"] or {}, r["capacity"] or {}
                t.add_row(name, _f(tt["mean"], 3), _f(tt["p50"]), _f(tt["p90"]), _f(tt["p99"]),
                          _f(tb.get("p99"), 3), f"{r['prefix_hit_ratio']:.1%}",
                          str(r["rejected_429"]), *(str(cap.get(x, "-")) for x in limits),
                          _f((r.get("schedule_us") or {}).get("p50"), 1))
        con.print(t)
        con.print(f"infinite-cache ceiling: {rep['ceiling_hit_ratio']:.1%} of input tokens")
        for k, v in rep["ratios"].items():
            con.print(f"mean TTFT {k}: {v:.3f}")
        con.print(f"simulated in {rep['wall_s']:.1f} s")
    return draw


def trace(
    ctx: typer.Context,
    trace_file: str = typer.Option(DEFAULT_TRACE, "--trace", metavar="FILE", help="Mooncake-"
                                   "format JSONL trace (timestamp ms, input_length, "
                                   "output_length, hash_ids of 512-token blocks; .gz read as "
                                   "gzip), or 'conversation': the FAST'25 conversation trace "
                                   "shipped with mooncake-cli."),
    simulate_: bool = typer.Option(False, "--simulate", help="Run the scheduler against "
                                   "simulated instances (else: live, with --url or --local)."),
    preset: str = typer.Option(None, "--preset", help="paper (default: the FAST'25 setup, "
                               "LLaMA3-70B on 8xA800) or none (with --profile)."),
    policy: str = typer.Option(None, "--policy", help="all (default), or one or more of "
                               "random, round-robin, least-load, cache-aware, "
                               "kvcache-centric, kvcache-pipeline (comma-separated)."),
    prefill: int = typer.Option(None, "--prefill", help="Prefill instances [default: 16]."),
    decode: int = typer.Option(None, "--decode", help="Decode instances, for TBT "
                               "[default: 16; 0: not simulated]."),
    colocated: int = typer.Option(None, "--colocated", help="Instances of the colocated "
                                  "(vLLM-like) baselines [default: prefill + decode; -1: skip]."),
    cache_tokens: int = typer.Option(None, "--cache-tokens", help="LRU prefix cache per "
                                     "instance in tokens [default: 3000000]."),
    time_scale: float = typer.Option(None, "--time-scale", help="Divide trace timestamps by "
                                     "this [default: 2]."),
    chunk_tokens: int = typer.Option(None, "--chunk-tokens", help="Token budget per step of "
                                     "the chunked-prefill baselines [default: 512]."),
    limit: int = typer.Option(None, "--limit", help="Only the first N requests."),
    seed: int = typer.Option(None, "--seed", help="Seed of the random policy [default: 0]."),
    ttft_slo: float = typer.Option(None, "--ttft-slo", help="Answer 429 when the estimated "
                                   "TTFT exceeds this many seconds [default: off]."),
    tbt_slo: float = typer.Option(None, "--tbt-slo", help="Answer 429 when the estimated "
                                  "TBT exceeds this many seconds [default: off]."),
    profile: str = typer.Option(None, "--profile", metavar="FILE", help="Cost model from a "
                                "profile.json (mooncake.profile/1) instead of the paper's."),
    explain: str = typer.Option(None, "--explain", metavar="FILE", help="Write every "
                                "decision with its per-candidate estimates as JSON lines."),
    plot: str = bench_plot.option("TTFT by policy, the TTFT and TBT distributions and the "
                                  "prefix-hit ratio over time"),
    url: str = typer.Option(None, "--url", help="Live replay against this running conductor "
                            "(http://HOST:PORT)."),
    local: str = typer.Option(None, "--local", metavar="P,D", help="Live replay: start a "
                              "cluster of P prefill + D decode workers per policy in "
                              "--policy [default: random,kvcache-centric]."),
    model: str = typer.Option("demo", "--model", help="With --local: checkpoint dir or demo."),
    block_tokens: int = typer.Option(16, "--block-tokens", help="Live: synthesised tokens per "
                                     "512-token trace block (scales requests down)."),
    max_input: int = typer.Option(512, "--max-input", help="Live: prompt tokens at most."),
    max_output: int = typer.Option(16, "--max-output", help="Live: output tokens at most."),
    vocab: int = typer.Option(256, "--vocab", help="Live: synthesised token ids lie in "
                              "[1, vocab)."),
    kv_blocks: int = typer.Option(None, "--kv-blocks", help="Live, --local: KV blocks per "
                                  "worker [default: 512]."),
    min_input: int = typer.Option(0, "--min-input", metavar="TOKENS", help="Live: replay only "
                                  "the requests (of the first --limit) whose synthesised "
                                  "prompt has at least TOKENS tokens, at their own arrival "
                                  "times."),
    threads: int = typer.Option(0, "--threads", help="Live, --local: torch threads of each "
                                "worker (0: torch's default)."),
    engine: str = typer.Option(None, "--engine", metavar="native|vllm", help="Live, --local: "
                               "the workers' engine, native (ours) or vllm (vLLM's async "
                               "engine: needs the mooncake-vllm plugin and vLLM; on a CPU a "
                               "--block-size that is a multiple of 32) [default: native]."),
    block_size: int = typer.Option(16, "--block-size", metavar="TOKENS", help="Live, --local: "
                                   "tokens per KV block of the workers and the conductor."),
    max_stages: int = typer.Option(2, "--max-stages", metavar="N", help="Live, --local: "
                                   "kvcache-pipeline's prefill workers per pipelined prefill "
                                   "at most, its lead included."),
    pipeline_chunk: int = typer.Option(2048, "--pipeline-chunk", metavar="TOKENS",
                                       help="Live, --local: kvcache-pipeline's prompt tokens "
                                       "per chunk between stages; shorter prompts are not "
                                       "pipelined."),
    pipeline_min_gain: float = typer.Option(0.3, "--pipeline-min-gain", metavar="FRACTION",
                                            help="Live, --local: the estimated TTFT gain (a "
                                            "fraction) a pipeline must bring over the best "
                                            "single worker."),
) -> None:
    """Replay a trace: --simulate runs the scheduler against simulated instances (TTFT and TBT
    percentiles, prefix-hit ratio and its infinite-cache ceiling, 429s and effective request
    capacity per policy, next to colocated vLLM-like baselines); --url or --local replays it
    against a live conductor through the OpenAI API. With --local and both kvcache-centric and
    kvcache-pipeline in --policy, the simulator also runs the same requests on the same cluster
    with the cost model the kvcache-centric run learned: kvcache-pipeline's predicted and live
    gains in mean TTFT, side by side."""
    out: Out = ctx.obj
    if not simulate_:
        if not (url or local):
            raise ConfigError("give --simulate, --url URL (a running conductor) or --local P,D")
        from mooncake_cli.bench.trace_live import ReplayConfig
        from mooncake_cli.commands.bench_trace_live import LocalSetup, run_live

        rcfg = ReplayConfig(block_tokens=block_tokens, max_input=max_input,
                            max_output=max_output, vocab=vocab, seed=seed or 0)
        if engine is not None and not local:
            raise ConfigError("--engine chooses the engine of the --local workers; a running "
                              "conductor's workers have theirs")
        setup = LocalSetup(kv_blocks=kv_blocks or 512, threads=threads, max_stages=max_stages,
                           pipeline_chunk=pipeline_chunk, pipeline_min_gain=pipeline_min_gain,
                           engine=engine or "native", block_size=block_size)
        run_live(out, trace_file, url, local, model, policy, time_scale or 1.0, limit, rcfg,
                 setup, plot, min_input)
        return
    if preset is None and profile:
        preset = "none"
    cfg = load(SimConfig, "bench_trace", out.config_file, preset=preset, policy=policy,
               prefill=prefill, decode=decode, colocated=colocated, cache_tokens=cache_tokens,
               time_scale=time_scale, chunk_tokens=chunk_tokens, limit=limit, seed=seed,
               ttft_slo=ttft_slo, tbt_slo=tbt_slo)
    bench_plot.check(plot)
    if out.json:
        report, samples = simulate(cfg, trace_file, profile, None, explain)
    else:
        bars = ProgressBars(out.err)
        with bars.bar:
            report, samples = simulate(cfg, trace_file, profile, bars, explain)
    bench_plot.draw(out, "trace", report, plot, samples=samples)
    out.emit(report, _human(report))
