"""vLLM's two Mooncake connectors under the same vLLM, ours against upstream's wheel, in one run:

    plugins/mooncake-vllm/.venv/bin/python plugins/mooncake-vllm/bench/connectors.py [--json]

- P/D (`MooncakeConnector`): a prefill and a decode instance per side; for each prompt length,
  `--rounds` distinct prompts; the KV transfer time per request is the prefill instance's own
  measure (its connector times each `batch_transfer_sync_write` and logs it at debug level:
  "Sending to ... done, took S"), summed per request.
- Store (`MooncakeStoreConnector`, embedded): instance A serves a 2,048-token prompt on an empty
  store (cold), then a fresh instance B serves it from the store; TTFT is the wall time of a
  1-token completion; the store's put and get time per request are vLLM's own histogram
  `vllm:mooncake_store_operation_time_seconds` (save_put on A, load_get on B).

Rows are medians over the rounds, with ours ÷ upstream (time ratios upstream/ours: above 1.0
means ours is faster). Uses the test harness (tests/: the sides, the vLLM servers, the export
of smollm2-135m); at most two vLLM processes run at once.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import MODEL, _cache_dir  # noqa: E402
from procs import free_port  # noqa: E402
from sides import Side, upstream_missing  # noqa: E402
from test_store_connector import KV_CONFIG, store_config  # noqa: E402
from vllm_server import VllmServer  # noqa: E402

SENT = re.compile(r"Sending to \S+ done, took ([0-9.e-]+)")
OP_TIME = "vllm:mooncake_store_operation_time_seconds"
LENGTHS = (512, 2048, 8191)  # 8,191 prompt tokens + 1 generated: smollm2's 8,192 positions
CTX = ["--max-model-len", "8192"]
WORDS = ("amber otter Lyon teal heron Porto crimson badger Graz ivory lynx Turku slate falcon "
         "Cork olive marten Split violet ibex Ghent copper gecko Bergen").split()


def prompt_of(tokens: int, seed: str, tokenizer: Any) -> str:
    """At most `tokens` tokens (and within a few of it) of smollm2's tokenizer, sharing no
    leading block with another seed's prompt."""
    def text(n: int) -> str:
        return " ".join([seed] + [WORDS[(i * 7 + len(seed)) % len(WORDS)] for i in range(n)])

    n = tokens
    for _ in range(6):  # words -> tokens is near linear: a few corrections reach it
        got = len(tokenizer(text(n))["input_ids"])
        if tokens - 4 <= got <= tokens:
            break
        n = max(1, n + (tokens - got) * 4 // 5 if got < tokens else n - (got - tokens) - 1)
    while len(tokenizer(text(n))["input_ids"]) > tokens:
        n -= 1
    return text(n)


def model_dir() -> Path:
    final = _cache_dir()
    if not (final / "config.json").is_file():
        sys.exit(f"no exported model in {final}: run the plugin's tests once, or "
                 f"`mooncake models export {MODEL} --hf {final}`")
    return final


def _sum_sent(log: Path, start: int) -> tuple[float, int]:
    text = log.read_text(errors="replace")[start:]
    took = [float(t) for t in SENT.findall(text)]
    return sum(took), len(took)


def pd_side(name: str, protocol: str, model: Path, logs: Path, rounds: int,
            tok: Any) -> dict[str, Any]:
    side = Side(name, logs)
    bootstrap = free_port()
    engine = f"prefill-{name}-{protocol}"

    def server(role: str, eid: str, extra: dict[str, str]) -> VllmServer:
        cfg = {"kv_connector": "MooncakeConnector", "kv_role": role, "engine_id": eid,
               "kv_connector_extra_config": {"mooncake_protocol": protocol}}
        env = {**side.env(), "VLLM_MOONCAKE_BOOTSTRAP_PORT": str(bootstrap), **extra}
        return VllmServer(f"{name} {role}", model, env, logs / f"{role}.log", cfg, CTX)

    p = server("kv_producer", engine, {"VLLM_LOGGING_LEVEL": "DEBUG"})
    d = server("kv_consumer", f"decode-{name}-{protocol}", {})
    rows: dict[str, Any] = {}
    try:
        p.wait_ready(), d.wait_ready()
        for n in LENGTHS:
            times, tokens = [], 0
            for r in range(rounds):
                prompt = prompt_of(n, f"pd{n}r{r}{uuid.uuid4().hex[:6]}", tok)
                mark = len(p.proc.log.read_text(errors="replace"))
                tid = uuid.uuid4().hex
                p.complete(prompt, max_tokens=1, kv_transfer_params={
                    "do_remote_decode": True, "do_remote_prefill": False, "transfer_id": tid})
                out = d.complete(prompt, max_tokens=1, kv_transfer_params={
                    "do_remote_decode": False, "do_remote_prefill": True, "transfer_id": tid,
                    "remote_engine_id": engine,
                    "remote_bootstrap_addr": f"http://127.0.0.1:{bootstrap}"})
                tokens = int(out["usage"]["prompt_tokens"])
                took, sends = _sum_sent(p.proc.log, mark)
                if sends == 0:
                    raise RuntimeError(f"{name}: no transfer logged for a {n}-token prompt")
                times.append(took)
            rows[str(n)] = {"tokens": tokens, "ms": statistics.median(times) * 1e3,
                            "all_ms": [round(t * 1e3, 2) for t in times]}
    finally:
        d.stop()
        p.stop()
        side.close()
    return rows


def _op(server: VllmServer, op: str) -> tuple[float, float]:
    """(sum seconds, count) of one store operation in vLLM's histogram, once it has one (a
    save ends after the response, and the figures follow it by a moment: up to 30 s)."""
    deadline = time.monotonic() + 30
    got = _op_now(server, op)
    while got[1] == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        got = _op_now(server, op)
    return got


def _op_now(server: VllmServer, op: str) -> tuple[float, float]:
    text = server.http.get("/metrics").text
    s = re.search(rf'^{OP_TIME}_sum{{[^}}]*operation="{op}"[^}}]*}} (\S+)$', text, re.M)
    c = re.search(rf'^{OP_TIME}_count{{[^}}]*operation="{op}"[^}}]*}} (\S+)$', text, re.M)
    return (float(s.group(1)) if s else 0.0, float(c.group(1)) if c else 0.0)


def timed(server: VllmServer, prompt: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = server.complete(prompt, max_tokens=1)
    return time.perf_counter() - t0, int(out["usage"]["prompt_tokens"])


def store_side(name: str, model: Path, logs: Path, rounds: int, tok: Any) -> dict[str, Any]:
    side = Side(name, logs)
    cold, warm, puts, gets, tokens = [], [], [], [], 0
    try:
        config = store_config(side, side.start_master(), standalone=False)
        env = {**side.env(), "MOONCAKE_CONFIG_PATH": str(config)}
        for r in range(rounds):
            prompt = prompt_of(2048, f"st{r}{uuid.uuid4().hex[:6]}", tok)
            a = VllmServer(f"{name} A{r}", model, env, logs / f"A{r}.log", KV_CONFIG, CTX)
            b: VllmServer | None = None
            try:
                t, tokens = timed(a.wait_ready(), prompt)
                cold.append(t)
                put_s, put_n = _op(a, "save_put")
                puts.append(put_s / max(put_n, 1))
                b = VllmServer(f"{name} B{r}", model, env, logs / f"B{r}.log", KV_CONFIG, CTX)
                t, _ = timed(b.wait_ready(), prompt)
                warm.append(t)
                get_s, get_n = _op(b, "load_get")
                gets.append(get_s / max(get_n, 1))
            finally:
                if b is not None:
                    b.stop()
                a.stop()
    finally:
        side.close()
    med = statistics.median
    return {"tokens": tokens, "cold_ms": med(cold) * 1e3, "store_ms": med(warm) * 1e3,
            "put_ms": med(puts) * 1e3, "get_ms": med(gets) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", choices=("pd", "store"))
    args = ap.parse_args()
    why = upstream_missing()
    if why:
        sys.exit(f"upstream's side cannot run: {why}")
    model = model_dir()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    logs = Path(tempfile.mkdtemp(prefix="bench-connectors-"))
    out: dict[str, Any] = {"logs": str(logs)}
    sides = [("ours", "tcp"), ("ours", "auto"), ("upstream", "tcp")]
    if args.only != "store":
        out["pd"] = {}
        for name, proto in sides:
            folder = logs / f"pd-{name}-{proto}"
            folder.mkdir()
            print(f"P/D {name} {proto} ...", file=sys.stderr, flush=True)
            out["pd"][f"{name}-{proto}"] = pd_side(name, proto, model, folder, args.rounds, tok)
    if args.only != "pd":
        out["store"] = {}
        for name in ("ours", "upstream"):
            folder = logs / f"store-{name}"
            folder.mkdir()
            print(f"store {name} ...", file=sys.stderr, flush=True)
            out["store"][name] = store_side(name, model, folder, args.rounds, tok)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        report(out)


def report(out: dict[str, Any]) -> None:
    if "pd" in out:
        up = out["pd"]["upstream-tcp"]
        print("P/D KV transfer per request (prefill's batch_transfer_sync_write), median ms")
        print(f"{'prompt':>8} {'ours tcp':>10} {'ours auto':>10} {'upstream':>10} "
              f"{'÷ tcp':>7} {'÷ auto':>7}")
        for n in LENGTHS:
            t, a, u = (out["pd"][k][str(n)]["ms"] for k in ("ours-tcp", "ours-auto",
                                                            "upstream-tcp"))
            print(f"{up[str(n)]['tokens']:>8} {t:>10.2f} {a:>10.2f} {u:>10.2f} "
                  f"{u / t:>7.2f} {u / a:>7.2f}")
    if "store" in out:
        o, u = out["store"]["ours"], out["store"]["upstream"]
        print(f"Store connector, {o['tokens']}-token prompt, median ms (ours ÷ upstream = "
              "upstream's time / ours)")
        for k, label in (("cold_ms", "TTFT cold"), ("store_ms", "TTFT from the store"),
                         ("put_ms", "store put per request"), ("get_ms", "store get per request")):
            ratio = f"{u[k] / o[k]:>7.2f}" if o[k] else "      -"
            print(f"{label:>24} {o[k]:>10.2f} {u[k]:>10.2f} {ratio}")
    print(f"logs: {out['logs']}")


if __name__ == "__main__":
    main()
