"""WorkerConfig: the settings of a prefill or decode worker (build with `mooncake_cli.config.load`,
section `[prefill]` or `[decode]`)."""

from __future__ import annotations

from dataclasses import dataclass

from mooncake_cli.config import described, size_field
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.kvkeys import WIRES

ROLES = ("prefill", "decode")


def split_listen(listen: str) -> tuple[str, int]:
    """("127.0.0.1", 8000) from "127.0.0.1:8000"; ConfigError for anything else."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"listen address {listen!r}: use HOST:PORT, e.g. 127.0.0.1:8100 "
                          "(port 0 picks a free one)")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class WorkerConfig:
    """One worker: its model, KV cache geometry, store, HTTP listener and conductor."""

    role: str = described("prefill", "prefill or decode")
    engine: str = described("native", "the engine that runs the model: native (ours), or vllm "
                                      "(vLLM's async engine in this process, its KV moved by "
                                      "vLLM's Mooncake connectors; needs the mooncake-vllm "
                                      "plugin and vLLM)")
    model: str = described("demo", "checkpoint directory (config.json, *.safetensors, "
                                   "tokenizer.json), .gguf file, named model, or a built-in "
                                   "demo with random weights (demo, demo-25m)")
    device: str = described("cpu", "cpu, cuda or cuda:N")
    dtype: str = described("float32", "float32, bfloat16 or float16")
    kv_wire: str = described("native", "the form KV blocks take in transfers and in the "
                                       "store: native (the KV dtype) or int8 (per block, "
                                       "layer, K/V and head a scale and zero point; about "
                                       "half of bfloat16's bytes, lossy); one setting per "
                                       "cluster: other settings name other store keys")
    threads: int = described(0, "torch threads for the model (0: torch's default, one per "
                                "core); on a host shared by several workers give each its "
                                "share of the cores")
    store: str = described("none", "HOST:PORT of the store master (or etcd://... of an HA "
                                   "store), or none")
    segment_size: int = size_field(256 << 20, "DRAM this worker contributes to the store, "
                                              "e.g. 1GiB; 0 for none")
    listen: str = described("127.0.0.1:0", "HTTP address HOST:PORT; port 0 picks a free one")
    advertise: str = described("", "host the conductor and other workers reach this one at "
                                   "(none: the listen host; this host's name for 0.0.0.0)")
    block_size: int = described(16, "tokens per KV block (one store object)")
    kv_blocks: int = described(512, "blocks in the paged KV cache")
    chunk_size: int = described(512, "prompt tokens computed per prefill step")
    conductor: str = described("", "http://HOST:PORT of a conductor to register with, or "
                                   "etcd://HOST:PORT[/CLUSTER] to register in etcd for "
                                   "conductors started with --registry")
    name: str = described("", "instance name (none: <role>@<listen address>)")
    heartbeat: float = described(1.0, "seconds between registrations with the conductor")
    drain_timeout: float = described(30.0, "seconds in-flight requests may take to finish on "
                                           "shutdown")
    write_behind: bool = described(True, "decode: put each generated KV block into the store "
                                         "as it fills, so that another decode worker can take "
                                         "a request over without recomputing it (needs --store)")
    max_waiting: int = described(256, "requests a worker queues before refusing more (503)")
    max_connections: int = described(4096, "HTTP connections (and requests) at once; 503 "
                                           "beyond")
    audit_log: str = described("", "JSONL file to append every reservation, prefill, "
                                   "generation and refused access to")

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"role {self.role!r}: use prefill or decode")
        split_listen(self.listen)
        if not self.engine or not self.engine.replace("-", "").isalnum():
            raise ConfigError(f"engine {self.engine!r}: use native or vllm")
        for name in ("block_size", "kv_blocks", "chunk_size", "max_waiting", "max_connections"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.block_size > 4096:
            raise ConfigError(f"block_size {self.block_size} is too large (at most 4096 tokens)")
        if self.heartbeat <= 0 or self.drain_timeout < 0:
            raise ConfigError("heartbeat must be > 0 and drain_timeout >= 0 seconds")
        if self.kv_wire not in WIRES:
            raise ConfigError(f"kv_wire {self.kv_wire!r}: use native or int8")
        if self.kv_wire != "native" and self.engine != "native":
            raise ConfigError(f"--kv-wire {self.kv_wire} needs our engine (--engine native)")
        if self.threads < 0:
            raise ConfigError(f"threads must be >= 0, got {self.threads}")
        if self.segment_size < 0:
            raise ConfigError("segment_size must not be negative")
        if self.conductor.startswith("etcd://"):
            from mooncake_cli.api.registration import parse

            parse(self.conductor)
        elif self.conductor and not self.conductor.startswith("http://"):
            raise ConfigError(f"conductor {self.conductor!r}: use http://HOST:PORT, or "
                              "etcd://HOST:PORT[,HOST:PORT][/CLUSTER] to register in etcd")
        if not self.store:
            raise ConfigError("store: give the master's HOST:PORT, or none")

    @property
    def uses_store(self) -> bool:
        return self.store.lower() != "none"
