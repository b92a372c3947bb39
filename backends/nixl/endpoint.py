"""One NIXL agent per engine: registers the engine's regions with NIXL (DRAM, or VRAM for a
CUDA tensor), publishes the agent's metadata as the segment's `nixl` field, and completes
posted transfers on one poller thread.

No UCX progress thread (it spins a core); a pump calls into the agent every PUMP seconds so
the passive side answers UCX wire-up and the emulated RMA of transports like tcp.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from mooncake_cli.transfer.spi import EngineSide, SegmentDescriptor, TransferError

log = logging.getLogger("mooncake.transfer.nixl")
PUMP = 0.005  # seconds between progress calls on an idle agent (wire-up, emulated RMA) once
# peers may know it (`shown`); before that it makes none: each wakes a thread for the GIL, and
# on a small host that preempts the store's request path (a tenth of 16-key puts took 2x)
POLL = 50e-6  # seconds between state checks while transfers are in flight


def region_desc(region: Any) -> tuple[str, int, int]:
    """(NIXL memory type, address, device id) of a registered region."""
    if region.view is not None:
        if region.length == 0:
            return "DRAM", 0, 0
        return "DRAM", int(np.frombuffer(region.view, dtype=np.uint8).ctypes.data), 0
    return cuda_desc(region)


def cuda_desc(region: Any) -> tuple[str, int, int]:
    """A device region (a flat uint8 tensor) without staging: a CUDA tensor as VRAM, which
    NIXL moves GPU to GPU (CUDA IPC, GPUDirect RDMA); a CPU tensor as DRAM. The VRAM branch
    runs only where a GPU exists."""
    t = region.device
    if t.device.type == "cpu":
        return "DRAM", int(t.data_ptr()), 0
    if t.device.type != "cuda":
        raise TransferError(f"nixl moves cpu and cuda memory, not {t.device.type}")
    return "VRAM", int(t.data_ptr()), int(t.device.index or 0)


Done = Callable[[str | None], None]


class NixlEndpoint:
    private_fields = True  # the agent's metadata is for peers that proved the secret

    def __init__(self, api: Any, engine: EngineSide) -> None:
        self.api, self.engine = api, engine
        self.agent_name = f"mooncake-{uuid.uuid4().hex[:12]}"
        sync = api.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT  # several threads use it
        cfg = api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"], sync_mode=sync)
        self.agent = api.nixl_agent(self.agent_name, cfg)
        if "UCX" not in self.agent.backends:
            raise TransferError("NIXL could not start its UCX backend")
        self._regs: dict[int, tuple[Any, tuple[str, int, int]]] = {}  # base -> (reg, desc)
        self._md: str | None = None
        self._remote: dict[str, str] = {}  # remote agent name -> metadata loaded
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: list[tuple[Any, float, Done]] = []
        self._closed = False
        self._shown = False  # a peer may know our agent: keep the passive side progressing
        self.idle_pumps = 0  # progress calls made with no transfer of ours in flight
        self._thread = threading.Thread(target=self._loop, name="mooncake-nixl", daemon=True)
        self._thread.start()

    # -- memory -------------------------------------------------------------------------------
    def register(self, region: Any) -> Mapping[str, str]:
        mem, addr, dev = region_desc(region)
        if region.length == 0:
            return {}
        reg = self.agent.register_memory([(addr, region.length, dev, "")], mem)
        with self._lock:
            self._regs[region.base] = (reg, (mem, addr, dev))
            self._md = None
        return {"nixl": f"{mem}:{addr}:{dev}"}

    def unregister(self, region: Any) -> None:
        with self._lock:
            item = self._regs.pop(region.base, None)
            self._md = None
        if item is not None:
            self.agent.deregister_memory(item[0])

    def local(self, region: Any) -> tuple[str, int, int]:
        item = self._regs.get(region.base)
        if item is None:
            raise TransferError(f"local region at {region.base} is not registered with nixl")
        return item[1]

    def fields(self) -> Mapping[str, str]:
        with self._lock:
            if self._md is None:
                self._md = base64.b64encode(self.agent.get_agent_metadata()).decode()
            return {"nixl": self._md, "nixl.agent": self.agent_name}

    def shown(self) -> None:
        """Our descriptor, and so our agent's metadata, may be with a peer now: progress the
        idle agent from here on (its wire-up, and RMA that UCX emulates, need it)."""
        with self._cond:
            if not self._shown:
                self._shown = True
                self._cond.notify()

    # -- peers --------------------------------------------------------------------------------
    def load_peer(self, desc: SegmentDescriptor, reconnect: bool = False) -> str:
        """Load (or refresh) the peer agent's metadata; its agent name. `reconnect` drops
        what NIXL holds of it first (its connection broke)."""
        md = desc.extra.get("nixl")
        if not md:
            raise TransferError(f"'{desc.name}' publishes no nixl agent")
        name = desc.extra.get("nixl.agent", "")
        self.shown()  # the peer learns of us through the connection
        with self._lock:
            if name and self._remote.get(name) == md and not reconnect:
                return name
        try:
            raw = base64.b64decode(md, validate=True)
        except ValueError as e:
            raise TransferError(f"'{desc.name}': malformed nixl metadata") from e
        try:
            if name in self._remote:
                self.agent.remove_remote_agent(name)
            loaded = self.agent.add_remote_agent(raw)
        except Exception as e:
            raise TransferError(f"'{desc.name}': nixl refused its agent metadata: "
                                f"{type(e).__name__}: {e}") from e
        loaded = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        with self._lock:
            self._remote[loaded] = md
        return loaded

    def connect(self, peer: SegmentDescriptor, secret: str | None, timeout: float) -> Any:
        from mooncake_backends.nixl.channel import NixlChannel

        return NixlChannel(self, peer, secret, timeout)

    # -- completion ---------------------------------------------------------------------------
    def watch(self, handle: Any, deadline: float, done: Done) -> None:
        """Complete `handle` (posted, in progress) on the poller thread: done(None) when it
        is DONE, done(reason) on an error or at `deadline`."""
        with self._cond:
            self._pending.append((handle, deadline, done))
            self._cond.notify()

    def state(self, handle: Any) -> str | None:
        """None while in progress, "" when done, else why it failed; releases finished ones."""
        try:
            st = self.agent.check_xfer_state(handle)
        except Exception as e:
            st = f"{type(e).__name__}: {e}"
        if st == "PROC":
            return None
        self.release(handle)
        return "" if st == "DONE" else ("nixl reported ERR" if st == "ERR" else st)

    def release(self, handle: Any) -> None:
        try:
            handle.release()
        except Exception as e:  # an aborted transfer may refuse: the agent keeps it
            log.debug("releasing a nixl transfer: %s", e)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    pending, self._pending = self._pending, []
                    break
                if not self._pending:
                    self._cond.wait(PUMP if self._shown else None)
                    idle = True
                else:
                    idle = False
                work = list(self._pending)
                pump = self._shown and not self._closed
            if idle and not work:
                if pump:
                    self.idle_pumps += 1
                    try:
                        self.agent.get_new_notifs()  # progress for the passive side
                    except Exception as e:
                        log.debug("nixl progress: %s", e)
                continue
            finished = []
            now = time.monotonic()
            for item in work:
                handle, deadline, done = item
                why = self.state(handle)
                if why is None and now > deadline:
                    self.release(handle)
                    why = f"timed out after {self.engine.timeout:g} s"
                if why is not None:
                    finished.append(item)
                    done(why or None)
            with self._cond:
                self._pending = [p for p in self._pending if p not in finished]
            if len(finished) < len(work):
                time.sleep(POLL)
        for handle, _, done in pending:
            self.release(handle)
            done("the engine closed")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)
        for reg, _ in list(self._regs.values()):
            try:
                self.agent.deregister_memory(reg)
            except Exception as e:
                log.debug("deregistering at close: %s", e)
        self._regs.clear()
