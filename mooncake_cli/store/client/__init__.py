"""The store's client side: `StoreClient` (store_client.py) and what it runs on a node: the DRAM
segment (memory.py), staging for batched transfers (staging.py), reading and writing replicas
(replica_io.py), adding replicas (replica_adds.py), what its segment holds (holdings.py, kept up
by keeper.py) and the SSD tier (ssd_node.py)."""

from mooncake_cli.store.client.store_client import StoreClient

__all__ = ["StoreClient"]
