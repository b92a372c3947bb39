"""`nixl` transport: NVIDIA's inference transfer library (NIXL) over its UCX backend, which
picks RDMA verbs, GPUDirect RDMA, CUDA IPC, shared memory (cma) or TCP as the hardware allows.

One NIXL agent per engine; its metadata and the registered descriptors travel in the segment
descriptor (`nixl`, `nixl.agent`, and a `nixl` field per region) through whichever metadata
backend the engine uses. Batches are handed over whole: one NIXL transfer per request, each
with its own status; a dead peer is FAILED within the timeout. `auto` prefers nixl only where
UCX can use RDMA or CUDA; `--transport nixl` forces it. Install with `mooncake-cli[nixl]`.
"""

from __future__ import annotations

from mooncake_backends.nixl import ucx

from mooncake_cli.transfer.spi import EngineSide, PluginError, SegmentDescriptor


class NixlTransport:
    name = "nixl"
    inline_bytes = 1 << 62  # posting never blocks: no hand-off to worker threads
    max_slices = 1  # NIXL stripes over rails itself
    batched = True  # channels take whole batches (BatchChannel.post)

    def __init__(self) -> None:
        self._module, self._why = ucx.find_module()
        if self._module is not None:
            ok, why = ucx.ucx_plugin(self._module)
            if not ok:
                self._why = why
        self.fast = self._fast_paths()
        # above shm (20) where UCX reports RDMA or CUDA; below tcp (10) otherwise: forced only
        self.priority = 30 if self.fast else 5

    def _fast_paths(self) -> str:
        """What UCX itself reports of RDMA and CUDA transports ("" when none). UCX is asked
        only where such devices exist (a child process, once), so other hosts pay nothing."""
        rdma, cuda = ucx.fast_paths()
        if self._module is None or self._why or not (rdma or cuda):
            return ""
        info = ucx.probe(self._module)
        parts = ([f"RDMA ({', '.join(info.rdma)})"] if info.rdma else []) + \
            ([f"CUDA ({', '.join(info.cuda)})"] if info.cuda else [])
        return " and ".join(parts)

    def rank(self, peer: SegmentDescriptor, local: SegmentDescriptor) -> int:
        """`priority`, but below shm (20) for a same-host peer whose memory is all on the
        CPU: a mapped copy beats any UCX path there."""
        same_host = peer.boot_id == local.boot_id and peer.boot_id != ""
        if same_host and all(r.location.startswith("cpu") for r in peer.regions):
            return min(self.priority, 15)
        return self.priority

    def available(self) -> tuple[bool, str]:
        if self._module is None or self._why:
            return False, self._why
        return True, ""

    def why_priority(self) -> str:
        """For `mooncake plugins`: when `auto` picks nixl."""
        if self.fast:
            return f"auto prefers nixl: UCX can use {self.fast}"
        return ("auto prefers shm/tcp: no RDMA or CUDA device here (UCX would use cma or "
                "tcp); --transport nixl forces it")

    def reachable(self, peer: SegmentDescriptor, local: SegmentDescriptor) -> tuple[bool, str]:
        if not any(r.extra.get("nixl") for r in peer.regions):
            return False, "the peer registers no memory with nixl"
        if "nixl" not in peer.extra and not peer.auth:
            return False, "the peer publishes no nixl agent"
        return True, f"UCX over {self.fast or 'cma or tcp (no RDMA or CUDA)'}"

    def attach(self, engine: EngineSide) -> object:
        from mooncake_backends.nixl.endpoint import NixlEndpoint

        ok, why = self.available()
        if not ok:
            raise PluginError(why)
        assert self._module is not None
        try:
            api = ucx.load_api(self._module)
            ucx.quiet_ib(self._module)  # before the agent starts UCX
            return NixlEndpoint(api, engine)
        except Exception as e:
            raise PluginError(f"nixl agent could not start: {type(e).__name__}: {e}") from e
