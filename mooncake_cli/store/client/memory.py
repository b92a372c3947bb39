"""Where a store client's DRAM segment comes from: the `dram` tier, on huge pages when asked."""

from __future__ import annotations

from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region


def allocate_dram(engine: TransferEngine, size: int, hugepages: bool = False,
                  strict: bool = False) -> tuple[Region, bool]:
    """A registered DRAM region of `size` bytes and whether it sits on huge pages. Plain: shared
    memory that same-host peers map. `hugepages`: explicit huge pages (private; peers use TCP);
    with none reserved, ConfigError saying how to reserve them when `strict`, otherwise a
    warning (logged by the tier) and the plain kind."""
    if hugepages:
        buf = engine.registry.get("mooncake.tiers", "dram").allocate(
            size, shared=False, hugepages=True, strict=strict)
        if buf.hugepages:
            return engine.register(buf.view), True
        buf.close()
    return engine.allocate(size), False
