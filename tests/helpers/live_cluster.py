"""A live `mooncake conductor start --local P,D` cluster of the real model in its own process,
for tests that watch a whole cluster (`mooncake top`, the monitoring checks)."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

from mooncake_cli.http import jsonhttp
from tests.helpers.procs import child_env
from tests.helpers.smollm import NAME
from tests.helpers.store_procs import REPO, read_line

START_TIMEOUT = 300.0  # the model loads once per worker on 2 shared cores


class LiveCluster:
    """`url` is the conductor's; `instances()` its instance list. Stop with `stop()`."""

    def __init__(self, local: str = "2,1", kv_blocks: int = 128) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mooncake_cli", "--json", "conductor", "start", "--local",
             local, "--model", NAME, "--port", "0", "--kv-blocks", str(kv_blocks)],
            stdout=subprocess.PIPE, cwd=REPO, env=child_env())
        try:
            event: dict[str, Any] = {}
            while event.get("event") != "serving":
                event = read_line(self.proc, START_TIMEOUT)
                assert event.get("event") in ("started", "serving"), event
            self.url = str(event["url"])
        except BaseException:
            self.stop()
            raise

    def instances(self) -> list[dict[str, Any]]:
        return list(jsonhttp.call(self.url + "/v1/instances").body["instances"])

    def complete(self, prompt: str, max_tokens: int = 4) -> dict[str, Any]:
        answer = jsonhttp.call(self.url + "/v1/completions",
                               {"model": NAME, "prompt": prompt, "max_tokens": max_tokens,
                                "temperature": 0, "ignore_eos": True}, timeout=120)
        assert answer.status == 200, answer.body
        return answer.body

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
