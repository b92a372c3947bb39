"""Write a profile document, fit it with the conductor's cost model, score held-out points."""

from __future__ import annotations

import json
import statistics
from typing import Any

from mooncake_cli.bench.profile_grid import ProfileConfig, Progress
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.costmodel import PROFILE_SCHEMA, FittedCostModel, profile_model


def _errors(model: FittedCostModel, samples: dict[str, Any]) -> dict[str, Any]:
    """Relative error |predicted - measured| / measured of each held-out sample."""
    rows = []
    for s in samples["prefill"]:
        pred = model.prefill_time(s["input_tokens"], s["cached_tokens"])
        rows.append({"kind": "prefill", "point": f"n={s['input_tokens']} p={s['cached_tokens']}",
                     "measured_s": s["seconds"], "predicted_s": pred})
    for s in samples["decode"]:
        pred = model.decode_step_time(s["batch"], s["context_tokens"])
        rows.append({"kind": "decode", "point": f"batch={s['batch']} ctx={s['context_tokens']}",
                     "measured_s": s["seconds"], "predicted_s": pred})
    for r in rows:
        r["error"] = abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"]
    summary = {}
    for kind in ("prefill", "decode"):
        errs = [r["error"] for r in rows if r["kind"] == kind]
        summary[kind] = {"mean": statistics.fmean(errs), "max": max(errs)} if errs else None
    every = [r["error"] for r in rows]
    summary["all"] = {"mean": statistics.fmean(every), "max": max(every)}
    return {"points": rows, "summary": summary}


def run_profile(cfg: ProfileConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Measure this machine's engine, write cfg.output, and return the report (the document,
    coefficients, errors)."""
    from mooncake_cli.bench.profile import Profiler  # torch: only for our engine

    profiler = Profiler(cfg)
    fit, held = profiler.measure(progress)
    ns = profiler.cache.ns
    doc = {
        "schema": PROFILE_SCHEMA,
        "model": f"{profiler.model.model_id} ({profiler.model.description})",
        "device": f"{profiler.model.device} {cfg.dtype}, {cfg.chunk_size}-token chunks",
        "block_tokens": cfg.block_size,
        "chunk_tokens": cfg.chunk_size,
        "kv_bytes_per_token": ns.block_bytes // cfg.block_size,
        "bandwidth_bytes_per_s": float(cfg.bandwidth),
        "prefill": fit["prefill"],
        "decode": fit["decode"],
        "held_out": held,
    }
    return fit_and_write(doc, cfg.output)


def fit_and_write(doc: dict[str, Any], output: str) -> dict[str, Any]:
    """Fit `doc` (a profile with its "held_out" samples) as the conductor does, add the
    coefficients and the held-out errors, write it to `output`, and return the report."""
    model = profile_model(doc, output)
    errors = _errors(model, doc["held_out"])
    doc["fit"] = {k: getattr(model, k) for k in ("c0", "c_quad", "c_lin", "d0", "d_batch",
                                                 "d_ctx")}
    doc["fit_error"] = errors["summary"]
    try:
        with open(output, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
    except OSError as e:
        raise ConfigError(f"cannot write {output}: {e.strerror}") from e
    return {"output": output, "profile": doc, "held_out": errors["points"],
            "fit_error": errors["summary"]}
