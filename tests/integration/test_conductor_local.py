"""`mooncake conductor start --local P,D --model demo`: a whole cluster from one command."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from mooncake_cli.http import jsonhttp
from tests.helpers.procs import child_env
from tests.helpers.store_procs import REPO, read_line


def test_local_cluster_serves_and_stops_cleanly() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_cli", "--json", "conductor",
                             "start", "--local", "2,1", "--model", "demo", "--port", "0",
                             "--kv-blocks", "128"], stdout=subprocess.PIPE, cwd=REPO,
                            env=child_env())
    try:
        events = [read_line(proc, 120) for _ in range(5)]
        assert [e["event"] for e in events] == ["started"] * 4 + ["serving"]
        assert any("prefill-1" in e["what"] for e in events[:4])
        url = events[-1]["url"]
        instances = jsonhttp.call(url + "/v1/instances").body["instances"]
        assert sorted(i["name"] for i in instances) == ["decode-0", "prefill-0", "prefill-1"]
        body = {"model": "demo", "prompt": "mooncake " * 8, "max_tokens": 5,
                "temperature": 0, "ignore_eos": True}
        first = jsonhttp.call(url + "/v1/completions", body, timeout=60)
        assert first.status == 200, first.body
        assert first.body["usage"]["completion_tokens"] == 5
        again = jsonhttp.call(url + "/v1/completions", body, timeout=60)
        assert again.body["choices"][0]["text"] == first.body["choices"][0]["text"]
        bad = jsonhttp.call(url + "/v1/completions", {**body, "max_tokens": -1})
        assert bad.status == 400
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    assert proc.stdout is not None
    tail = [json.loads(line) for line in proc.stdout.read().splitlines() if line.strip()]
    assert rc == 0 and tail[-1]["event"] == "stopped"


def test_local_spec_errors() -> None:
    done = subprocess.run([sys.executable, "-m", "mooncake_cli", "conductor", "start",
                           "--local", "two,1"], capture_output=True, cwd=REPO, env=child_env(),
                          timeout=120)
    assert done.returncode == 2 and b"use P,D" in done.stderr
