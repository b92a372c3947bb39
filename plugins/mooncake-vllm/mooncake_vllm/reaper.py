"""After a failed engine start, what is left of it is killed: vLLM can hang on its way out.

When a vLLM engine fails to start, its engine core stops its workers with SIGTERM, which each
worker turns into SystemExit; one that arrives while the worker runs a garbage collector's
finalizer (a transfer engine of the connector that failed, closing its threads) is swallowed
("Exception ignored"), the worker lives on, its engine core waits for it at exit, and this
process waits for the engine core: the start never ends. `Reaper` watches the engine's log
while it starts; once vLLM has logged that the engine core failed to start, the processes the
start made that are still there after `grace` seconds are killed, and the start fails with
vLLM's cause.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType

FAILED = "EngineCore failed to start"


class Reaper:
    def __init__(self, vllm_log: Path, grace: float = 15.0) -> None:
        import psutil

        self.log, self.grace = vllm_log, grace
        self._me = psutil.Process()
        self._before = {p.pid for p in self._me.children(recursive=True)}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mooncake-vllm-reaper",
                                        daemon=True)

    def _failed(self) -> bool:
        try:
            return FAILED in self.log.read_text(errors="replace")
        except OSError:
            return False

    def _watch(self) -> None:
        while not self._done.wait(1.0):  # polling vLLM's log file
            if self._failed():
                if not self._done.wait(self.grace):
                    self._kill()
                return

    def _kill(self) -> None:
        import psutil

        left = [p for p in self._me.children(recursive=True) if p.pid not in self._before]
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                continue
        try:  # said in vLLM's log, which the start's one line names
            with open(self.log, "a", encoding="utf-8") as out:
                out.write(f"mooncake: the engine failed to start and hung on its way out: "
                          f"killed {len(left)} of its processes\n")
        except OSError:
            pass

    def __enter__(self) -> Reaper:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()
