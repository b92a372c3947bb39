"""OnlineCostModel: a cost model learned from the timings live workers report.

Used by the live conductor when no profile.json is given. Prefill time is `overhead + compute`.
Compute is fitted to the last `window` prefills the workers reported (`observe_prefill`: the
prompt's length n, the p tokens it reused, the compute seconds) with the profile's shape,
`c_lin * (n - p) + c_quad * (n^2 - p^2)` (attention grows with the position, so a long prompt
costs more per token than a short one), once the window holds three distinct lengths; before,
`per_token * (n - p)`, an exponentially weighted average. Overhead is the weighted average of
the rest of the time a request held the worker (reserving decode KV, loading and storing
blocks, the last transfer). A decode step is the recent step time the decode workers report in
their load (`observe_decode`); a pipeline stage's hand-off per token is what the leads of
pipelined prefills report (`observe_handoff`: the seconds they spent writing each chunk's
hidden states to the next stage and telling it, over the tokens they computed). A pipelined
prefill also reports the lead's compute over its share of the layers, which stands for a
single instance's in proportion to the layers.

Until the first reports the priors hold (1 ms per token, 20 ms per step, 20 µs per token
handed off), so the first decisions are sane and later ones follow the hardware.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from mooncake_cli.scheduler.costmodel import fit_nonnegative


@dataclass
class OnlineCostModel:
    block_tokens: int
    kv_bytes_per_token: int
    bandwidth: float
    name: str = "online"
    per_token_s: float = 1e-3
    overhead_s: float = 5e-3
    step_s: float = 0.02
    handoff_s_per_token: float = 2e-5
    c_lin: float | None = None  # fitted compute seconds per token (None: not fitted yet)
    c_quad: float = 0.0  # fitted compute seconds per (n^2 - p^2)
    alpha: float = 0.2
    window: int = 64
    _samples: deque[tuple[int, int, float]] = field(default_factory=deque, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def compute_time(self, n: int, p: int = 0) -> float:
        """Seconds of compute to prefill tokens p..n on one instance."""
        p = min(max(p, 0), n)
        if self.c_lin is None:
            return self.per_token_s * (n - p)
        return self.c_lin * (n - p) + self.c_quad * (n * n - p * p)

    def prefill_time(self, n: int, p: int = 0) -> float:
        return self.overhead_s + self.compute_time(n, p)

    def decode_step_time(self, batch: int, context_tokens: int) -> float:
        return self.step_s

    def observe_prefill(self, n: int, p: int, seconds: float,
                        service_s: float | None = None) -> None:
        """A prefill of an `n`-token prompt reusing `p` that computed for `seconds`, holding
        the worker `service_s` in all (when known)."""
        if n - p < 1 or seconds <= 0:
            return
        with self._lock:
            self.per_token_s += self.alpha * (seconds / (n - p) - self.per_token_s)
            self._samples.append((n, p, seconds))
            while len(self._samples) > self.window:
                self._samples.popleft()
            self._refit()
            if service_s is not None and service_s >= seconds:
                rest = service_s - self.compute_time(n, p)
                self.overhead_s += self.alpha * (max(rest, 0.0) - self.overhead_s)

    def _refit(self) -> None:
        if len({n - p for n, p, _ in self._samples}) < 3:
            return
        rows = [[float(n - p), float(n * n - p * p)] for n, p, _ in self._samples]
        lin, quad = fit_nonnegative(rows, [s for _, _, s in self._samples])
        if lin > 0 or quad > 0:
            self.c_lin, self.c_quad = lin, quad

    def observe_handoff(self, tokens: int, seconds: float) -> None:
        """A pipeline's lead handed `tokens` tokens to its next stage in `seconds`."""
        if tokens >= 1 and seconds >= 0:
            with self._lock:
                per = seconds / tokens
                self.handoff_s_per_token += self.alpha * (per - self.handoff_s_per_token)

    def observe_decode(self, step_seconds: float) -> None:
        if step_seconds > 0:
            with self._lock:
                self.step_s += self.alpha * (step_seconds - self.step_s)

    def to_dict(self) -> dict[str, Any]:
        """What it has learned (`OnlineCostModel(**d)` makes the same estimates)."""
        return {"name": self.name, "block_tokens": self.block_tokens,
                "kv_bytes_per_token": self.kv_bytes_per_token, "bandwidth": self.bandwidth,
                "per_token_s": self.per_token_s, "overhead_s": self.overhead_s,
                "step_s": self.step_s, "handoff_s_per_token": self.handoff_s_per_token,
                "c_lin": self.c_lin, "c_quad": self.c_quad}
