"""A burst on a live cluster (`--local 1,2 --model demo`): 20 concurrent streaming requests
are placed on both decode workers, as the conductor's explain log and each worker's own
/metrics say -- before bookings were counted, every one of them went to the same worker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

from mooncake_cli.http import jsonhttp
from tests.helpers.procs import child_env
from tests.helpers.prom import value
from tests.helpers.store_procs import REPO, read_line

STREAMS = 20


def stream(url: str, i: int, start: threading.Barrier, out: list[str]) -> None:
    body = {"model": "demo", "prompt": f"request {i}: " + "mooncake " * 12, "max_tokens": 24,
            "temperature": 0, "ignore_eos": True, "stream": True}
    start.wait(60)
    text = "".join(ev["choices"][0]["text"] for ev in
                   jsonhttp.events(url + "/v1/completions", body, timeout=300)
                   if ev.get("choices"))
    out[i] = text


def test_a_burst_of_streams_uses_both_decode_workers(tmp_path: Path) -> None:
    explain = tmp_path / "explain.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_cli", "--json", "conductor",
                             "start", "--local", "1,2", "--model", "demo", "--port", "0",
                             "--kv-blocks", "256", "--explain", str(explain)],
                            stdout=subprocess.PIPE, cwd=REPO, env=child_env())
    try:
        event: dict[str, object] = {}
        while event.get("event") != "serving":
            event = read_line(proc, 180)
            assert event.get("event") in ("started", "serving"), event
        url = str(event["url"])
        texts = [""] * STREAMS
        start = threading.Barrier(STREAMS)
        threads = [threading.Thread(target=stream, args=(url, i, start, texts))
                   for i in range(STREAMS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert all(texts), "every stream answered"
        placed = Counter(json.loads(line)["decode"] for line in
                         explain.read_text().splitlines())
        instances = jsonhttp.call(url + "/v1/instances").body["instances"]
        decode = {i["name"]: i["url"] for i in instances if i["role"] == "decode"}
        served = {name: value(jsonhttp.call(u + "/metrics").body["text"],
                              "mooncake_worker_requests_total", role="decode")
                  for name, u in decode.items()}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert sorted(placed) == sorted(decode) and sum(placed.values()) == STREAMS, placed
    assert min(placed.values()) >= STREAMS // 4, placed  # 20/0 before; 10/10 when in flight
    assert served == {name: float(n) for name, n in placed.items()}, (served, placed)
