"""The store's client side: `StoreClient` (store_client.py), the object client (puts in
batch_puts.py, reads in batch_reads.py), composed with its `SegmentOwner` (segment_owner.py),
what it runs on a node: the DRAM segment (memory.py), what the segment holds (holdings.py, kept
up by keeper.py and liveness.py) and the SSD tier (ssd_node.py); both use staging for batched
transfers (staging.py), reading and writing replicas (replica_io.py) and adding replicas
(replica_adds.py)."""

from mooncake_cli.store.client.store_client import StoreClient

__all__ = ["StoreClient"]
