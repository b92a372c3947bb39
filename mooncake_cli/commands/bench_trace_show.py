"""The human view of a live `bench trace` report: the runs, and the simulator's prediction
for the same requests and cluster when the report has one."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table


def _f(x: Any, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _runs(rep: dict[str, Any]) -> Table:
    s = rep["setup"]
    long = f" with prompts >= {s['min_input']} tokens" if s.get("min_input") else ""
    t = Table(title=f"bench trace (live): {rep['requests']} requests of {rep['trace']}{long}, "
                    f"{rep['target']}", title_justify="left", box=box.SIMPLE_HEAD,
              caption="TTFT/TBT in s (TBT: mean of a request's longest 10% gaps); hit: prompt "
                      "tokens the prefill workers reused; piped: prefills run as pipelines "
                      "(+ pipelines their lead ran alone)", caption_justify="left")
    cols = ["policy", "TTFT", "p50", "p90", "p99", "TBTp99", "hit", "piped", "429", "errors"]
    for c in cols:
        t.add_column(c, justify="left" if c == "policy" else "right", no_wrap=True)
    for name, r in rep["runs"].items():
        tt, tb = r["ttft_s"], r["tbt_s"]
        piped = str(r.get("pipelined", 0))
        if r.get("pipeline_fallbacks"):
            piped += f" (+{r['pipeline_fallbacks']})"
        t.add_row(name, _f(tt["mean"]), _f(tt["p50"]), _f(tt["p90"]), _f(tt["p99"]),
                  _f(tb["p99"]), _pct(r["prefix_hit_ratio"]), piped, str(r["rejected_429"]),
                  str(r["errors"]))
    return t


def _compute(m: dict[str, Any]) -> str:
    """A learned model's prefill compute, in words."""
    if m.get("c_lin") is None:
        return f"{m['per_token_s'] * 1e3:.3f} ms per prompt token"
    return f"{m['c_lin'] * 1e3:.3f} ms per token + {m['c_quad'] * 1e9:.2f} ns per n²-p²"


def _predicted(pred: dict[str, Any]) -> Table:
    m = pred["cost_model"]
    t = Table(title="simulated: the same requests and cluster, the cost model the "
                    "kvcache-centric run learned", title_justify="left", box=box.SIMPLE_HEAD,
              caption=f"cost model: {_compute(m)} + "
                      f"{m['overhead_s'] * 1e3:.1f} ms per prefill, decode step "
                      f"{m['step_s'] * 1e3:.1f} ms, hand-off {m['handoff_s_per_token'] * 1e6:.1f}"
                      f" µs per token (learned by the {m['handoff_from']} run); cache "
                      f"{pred['cache_tokens']} tokens per prefill instance",
              caption_justify="left")
    for c in ("policy", "TTFT", "p50", "p90", "p99", "hit", "piped"):
        t.add_column(c, justify="left" if c == "policy" else "right", no_wrap=True)
    for name, r in pred["policies"].items():
        tt = r["ttft_s"]
        t.add_row(name, _f(tt["mean"]), _f(tt["p50"]), _f(tt["p90"]), _f(tt["p99"]),
                  _pct(r["prefix_hit_ratio"]), str(r["pipelined"]))
    return t


def live_table(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        con.print(_runs(rep))
        for k, v in rep.get("ratios", {}).items():
            con.print(f"{k}: {v:.3f}")
        pred = rep.get("prediction")
        if pred is None:
            return
        con.print(_predicted(pred))
        g = pred["gain"]
        diff = g["difference_points"]
        con.print("kvcache-pipeline's gain, 1 - mean TTFT kvcache-pipeline / kvcache-centric: "
                  f"predicted {_pct(g['predicted'])}, live {_pct(g['live'])}"
                  + ("" if diff is None else f" ({diff:+.1f} points)"))
    return draw
