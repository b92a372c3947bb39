"""The reaper of a failed vLLM start: once the log says the engine core failed to start, the
processes the start made that are still there after the grace period are killed (vLLM's
engine can hang on its way out, and the start would never end); those that were there before
are left alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mooncake_vllm.reaper import FAILED, Reaper


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])


def test_what_a_failed_start_left_is_killed(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("INFO starting\n")
    before = sleeper()
    try:
        with Reaper(log, grace=0.5):
            hung = sleeper()
            log.write_text(f"ERROR {FAILED}.\nValueError: no\n")
            assert hung.wait(timeout=30) == -9
        assert before.poll() is None
        assert "killed 1 of its processes" in log.read_text()
    finally:
        before.kill()
        before.wait()

