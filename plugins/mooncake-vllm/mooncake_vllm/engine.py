"""One vLLM async engine (`AsyncLLM`) in this process, configured from a worker's settings; vLLM
starts its engine-core and worker processes beside it.

Its KV connector is vLLM's MultiConnector holding vLLM's MooncakeConnector (prefill -> decode:
`kv_producer` on a prefill worker, `kv_consumer` on a decode worker) and, with a store,
MooncakeStoreConnector (`kv_both`: prefix blocks saved to and loaded from the store); both
reach our transfer engine and store through mooncake-compat's `mooncake.engine` and
`mooncake.store`. What vLLM's processes take only from the environment (the bootstrap port, the
store's config file, the host peers reach, the cluster secret) is set while the engine starts:
they inherit it then. Engines start one at a time (this process's environment is shared).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mooncake_cli.interfaces import MooncakeError

from mooncake_vllm.reaper import Reaper
from mooncake_vllm.startlog import captured, cause, quiet_exit, to_file
from mooncake_vllm.stats import EngineStats, logger_class

LOCAL_BUFFER = 64 << 20  # bytes of each store client's staging buffer
_starting = threading.Lock()


class EngineStartError(MooncakeError):
    """vLLM's engine did not start; the message carries the cause vLLM logged."""


@dataclass(frozen=True)
class EngineSpec:
    role: str  # prefill or decode
    engine_id: str  # the MooncakeConnector's engine id (the worker's name)
    model_dir: Path
    host: str  # the address peers reach this host at (VLLM_HOST_IP)
    dtype: str
    block_size: int
    kv_blocks: int
    chunk_size: int
    store: str  # the store master's HOST:PORT, "" for none
    segment_size: int  # bytes contributed to the store (0: a standalone store holds them)
    protocol: str  # MooncakeConnector's mooncake_protocol: tcp or auto
    secret: str
    bootstrap_port: int  # prefill: where vLLM's Mooncake bootstrap server listens
    kv_events: dict[str, Any] | None = None  # vLLM's KVEventsConfig (kv_events.py), or none


def connector_config(spec: EngineSpec) -> dict[str, Any]:
    pd = {"kv_connector": "MooncakeConnector",
          "kv_role": "kv_producer" if spec.role == "prefill" else "kv_consumer",
          "kv_connector_extra_config": {"mooncake_protocol": spec.protocol}}
    if not spec.store:
        return {**pd, "engine_id": spec.engine_id}
    # a block the store lost (its node gone) is recomputed, not the request failed
    store = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
             "kv_load_failure_policy": "recompute"}
    # the P/D connector first: a decode request's prompt comes from its prefill worker
    return {"kv_connector": "MultiConnector", "kv_role": "kv_both",
            "engine_id": spec.engine_id, "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"connectors": [pd, store]}}


def store_config(spec: EngineSpec) -> dict[str, Any]:
    """MooncakeStoreConnector's mooncake.json."""
    return {"metadata_server": "P2PHANDSHAKE", "master_server_address": spec.store,
            "protocol": "tcp", "device_name": "",
            "mode": "embedded" if spec.segment_size else "standalone-store",
            "global_segment_size": spec.segment_size, "local_buffer_size": LOCAL_BUFFER}


@contextlib.contextmanager
def environment(values: dict[str, str | None]) -> Iterator[None]:
    """`values` in os.environ meanwhile (None: unset)."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


class VllmEngine:
    """Starts at construction (minutes on a busy CPU host); EngineStartError with vLLM's cause
    when it does not. `llm` is the AsyncLLM; use it from one event loop."""

    def __init__(self, spec: EngineSpec, sink: EngineStats, log: Path) -> None:
        self.spec, self.log = spec, log
        self._dir = Path(tempfile.mkdtemp(prefix="mooncake-vllm-"))
        env: dict[str, str | None] = {
            "VLLM_HOST_IP": spec.host, "VLLM_MOONCAKE_BOOTSTRAP_PORT": str(spec.bootstrap_port),
            "MOONCAKE_CONFIG_PATH": None, "MOONCAKE_SECRET": spec.secret or None,
            "MOONCAKE_SECRET_FILE": None}
        if spec.store:
            path = self._dir / "mooncake.json"
            path.write_text(json.dumps(store_config(spec)))
            env["MOONCAKE_CONFIG_PATH"] = str(path)
        try:
            with _starting, captured(log), environment(env), Reaper(log):
                self.llm = self._start(sink)
        except Exception as e:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise EngineStartError(f"the vLLM engine of {spec.engine_id} did not start: "
                                   f"{cause(log, e)} (vLLM's log: {log})") from None
        quiet_exit(log)
        config = self.llm.vllm_config
        self.max_model_len = int(config.model_config.max_model_len)
        self.num_blocks = int(config.cache_config.num_gpu_blocks or spec.kv_blocks)
        self.block_bytes = self._token_bytes(config) * spec.block_size
        sink.token_bytes = self.block_bytes // spec.block_size

    def _start(self, sink: EngineStats) -> Any:
        from vllm.config import KVEventsConfig, KVTransferConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        s = self.spec
        args = AsyncEngineArgs(
            model=str(s.model_dir), dtype=s.dtype, block_size=s.block_size,
            num_gpu_blocks_override=s.kv_blocks, max_num_batched_tokens=s.chunk_size,
            # compiling takes minutes on a CPU and gains little there
            enforce_eager=current_platform.is_cpu(),
            kv_transfer_config=KVTransferConfig(**connector_config(s)),
            kv_events_config=KVEventsConfig(**s.kv_events) if s.kv_events else None)
        llm = AsyncLLM.from_engine_args(args, stat_loggers=[logger_class(sink)])
        to_file(self.log)  # after AsyncLLM, which configures vLLM's logging (to stdout)
        return llm

    @staticmethod
    def _token_bytes(config: Any) -> int:
        """KV bytes of one token: keys and values of every layer."""
        import torch

        mc, pc = config.model_config, config.parallel_config
        dtype = mc.dtype if config.cache_config.cache_dtype == "auto" else torch.uint8
        itemsize = torch.empty((), dtype=dtype).element_size()
        return int(2 * mc.get_num_layers(pc) * mc.get_num_kv_heads(pc) * mc.get_head_size()
                   * itemsize)

    def close(self) -> None:
        self.llm.shutdown()
        shutil.rmtree(self._dir, ignore_errors=True)
