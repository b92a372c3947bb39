"""What `mooncake store serve` says once its node is up: segments, SSD rescan, huge pages."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from mooncake_cli.config import human_size
from mooncake_cli.config.store import StoreConfig
from mooncake_cli.store.client import StoreClient


def serve_ready(cfg: StoreConfig, segment: str, client: StoreClient) -> tuple[dict[str, Any],
                                                                              str]:
    """The `ready` event of a store node (JSON record, human text)."""
    node = client.owner
    record: dict[str, Any] = {"event": "ready", "master": cfg.master, "segment": segment,
                              "client_id": node.client_id, "size": cfg.segment_size,
                              "hugepages": node.hugepages}
    text = (f"store node [bold]{escape(segment)}[/bold] contributes "
            f"{human_size(cfg.segment_size)} of DRAM"
            f"{' on huge pages' if node.hugepages else ''}")
    if cfg.hugepages and not node.hugepages:
        text += " (huge pages asked for but none reserved: normal pages; see the warning)"
    if node.ssd is not None:
        ssd = node.ssd
        scan = ssd.rescan
        record["ssd"] = {"dir": ssd.buf.directory, "size": ssd.buf.size,
                         "registered": len(scan.registered), "skipped": list(scan.skipped)}
        text += (f" and {human_size(ssd.buf.size)} of SSD in "
                 f"{escape(ssd.buf.directory)} ({len(scan.registered)} objects found "
                 "there re-registered")
        text += f", {len(scan.skipped)} skipped)" if scan.skipped else ")"
        text += "".join(f"\n  skipped {escape(s)}" for s in scan.skipped)
    text += f" to the master at {escape(cfg.master)}\nCtrl-C to stop."
    return record, text
