"""OnlineCostModel: a cost model learned from the timings live workers report.

Used by the live conductor when no profile.json is given. Prefill time is
`overhead + per_token * (n - p)`, both kept as exponentially weighted averages of what prefill
workers report (`observe_prefill`): per_token from the compute time, overhead from the rest of
the time a request held the worker (reserving decode KV, loading and storing blocks, the last
transfer); a decode step is the recent step time the decode workers
report in their load (`observe_decode`); a pipeline stage's hand-off per token is what the
leads of pipelined prefills report (`observe_handoff`: the seconds they spent writing each
chunk's hidden states to the next stage and telling it, over the tokens they computed).
Until the first report the priors hold (1 ms per token, 20 ms per step, 20 µs per token
handed off), so the first decisions are sane and later ones follow the hardware.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


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
    alpha: float = 0.2
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def prefill_time(self, n: int, p: int = 0) -> float:
        return self.overhead_s + self.per_token_s * max(n - p, 0)

    def decode_step_time(self, batch: int, context_tokens: int) -> float:
        return self.step_s

    def observe_prefill(self, computed_tokens: int, seconds: float,
                        service_s: float | None = None) -> None:
        """A prefill that computed `computed_tokens` tokens in `seconds` of compute, holding
        the worker `service_s` in all (when known)."""
        if computed_tokens < 1 or seconds <= 0:
            return
        with self._lock:
            per = seconds / computed_tokens
            self.per_token_s += self.alpha * (per - self.per_token_s)
            if service_s is not None and service_s >= seconds:
                rest = service_s - self.per_token_s * computed_tokens
                self.overhead_s += self.alpha * (max(rest, 0.0) - self.overhead_s)

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

    def to_dict(self) -> dict[str, float | str]:
        return {"name": self.name, "per_token_s": self.per_token_s,
                "overhead_s": self.overhead_s, "step_s": self.step_s,
                "handoff_s_per_token": self.handoff_s_per_token}
