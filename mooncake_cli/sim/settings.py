"""What a simulation runs: the cluster shape, the cache, the trace scaling and the SLOs
([bench_trace] in the config file). `--preset paper` pins the FAST'25 setup."""

from __future__ import annotations

from dataclasses import dataclass

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.costmodel import CostModel
from mooncake_cli.scheduler.scheduler import POLICIES, Slo

PRESETS = ("paper", "none")
BASELINES = ("vllm", "vllm+prefix", "vllm+chunked", "vllm+prefix+chunked")


@dataclass(frozen=True)
class SimConfig:
    """A simulated cluster. Empty or zero fields take the preset's value."""

    preset: str = "paper"
    policy: str = "all"  # a policy name, "all", or a comma-separated list
    prefill: int = 16
    decode: int = 16  # 0: decode not simulated (not limiting; no TBT)
    colocated: int = 0  # instances of the colocated baselines; 0: prefill + decode; -1: none
    cache_tokens: int = 3_000_000  # LRU prefix cache per prefill instance, in tokens
    time_scale: float = 2.0  # trace timestamps are divided by this
    chunk_tokens: int = 512  # token budget per step of the chunked-prefill baselines
    limit: int = 0  # first N requests only; 0: all
    seed: int = 0
    ttft_slo: float = 0.0  # seconds; 0: admit regardless of TTFT
    tbt_slo: float = 0.0  # seconds; 0: admit regardless of TBT
    ttft_threshold: float = 30.0  # effective-capacity thresholds (the paper's)
    tbt_thresholds: str = "0.1,0.2,0.3"

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError(f"--preset must be one of {', '.join(PRESETS)}, not "
                              f"'{self.preset}'")
        self.policies()
        if self.prefill < 1:
            raise ConfigError(f"--prefill must be >= 1 instance, not {self.prefill}")
        if self.decode < 0 or self.colocated < -1:
            raise ConfigError("--decode must be >= 0 and --colocated >= -1 (-1: no baselines)")
        if self.cache_tokens < 0 or self.chunk_tokens < 1:
            raise ConfigError("--cache-tokens must be >= 0 and --chunk-tokens >= 1")
        if not self.time_scale > 0:
            raise ConfigError(f"--time-scale must be > 0, not {self.time_scale}")
        if self.limit < 0:
            raise ConfigError(f"--limit must be >= 0 (0: whole trace), not {self.limit}")
        if self.ttft_slo < 0 or self.tbt_slo < 0 or self.ttft_threshold <= 0:
            raise ConfigError("SLOs must be >= 0 seconds (0: off) and thresholds > 0")
        self.tbt_limits()

    def policies(self) -> list[str]:
        """The policies to run, in the order given."""
        if self.policy == "all":
            return list(POLICIES)
        names = [p.strip() for p in self.policy.split(",") if p.strip()]
        bad = [p for p in names if p not in POLICIES]
        if not names or bad:
            raise ConfigError(f"unknown policy {', '.join(bad) or repr(self.policy)}: use "
                              f"all or a comma-separated list of {', '.join(POLICIES)}")
        return names

    def tbt_limits(self) -> list[float]:
        try:
            vals = [float(x) for x in self.tbt_thresholds.split(",") if x.strip()]
        except ValueError:
            vals = []
        if not vals or min(vals) <= 0:
            raise ConfigError(f"--tbt-thresholds must be seconds > 0 separated by commas, "
                              f"not {self.tbt_thresholds!r}")
        return vals

    def slo(self, decode: bool = True) -> Slo:
        return Slo(self.ttft_slo or None, (self.tbt_slo or None) if decode else None)

    def cache_blocks(self, model: CostModel) -> int:
        return self.cache_tokens // model.block_tokens

    def colocated_instances(self) -> int:
        return self.prefill + self.decode if self.colocated == 0 else self.colocated
