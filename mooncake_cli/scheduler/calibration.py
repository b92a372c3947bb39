"""TtftCalibration: what clients see against what the cost model estimates.

The scheduler's TTFT estimate of a placement (queue + prefill + fetch) misses what the cost
model does not know: HTTP hops, event loops, a host loaded by other work — a fixed part and a
part that grows with the prefill queue. Each placed request's estimate `x` and the TTFT it saw
after placement `y` update an exponentially weighted least-squares line y = a + b x, and
`apply(x)` is that line (the estimate itself until there are observations to fit).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class TtftCalibration:
    decay: float = 0.97  # weight kept by the past at each observation
    _w: float = 0.0
    _x: float = 0.0
    _y: float = 0.0
    _xx: float = 0.0
    _xy: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe(self, estimated_s: float, actual_s: float) -> None:
        if not (estimated_s >= 0 and actual_s >= 0):
            return
        with self._lock:
            d = self.decay
            self._w = self._w * d + 1
            self._x = self._x * d + estimated_s
            self._y = self._y * d + actual_s
            self._xx = self._xx * d + estimated_s * estimated_s
            self._xy = self._xy * d + estimated_s * actual_s

    def line(self) -> tuple[float, float]:
        """(a, b) of y = a + b x; (0, 1) before any observation."""
        with self._lock:
            if self._w < 1:
                return 0.0, 1.0
            mx, my = self._x / self._w, self._y / self._w
            var = self._xx / self._w - mx * mx
            b = (self._xy / self._w - mx * my) / var if var > 1e-6 else 1.0
            b = min(max(b, 1.0), 20.0)  # never below the model's own growth
            return max(my - b * mx, 0.0), b

    def apply(self, estimated_s: float) -> float:
        a, b = self.line()
        return a + b * estimated_s
