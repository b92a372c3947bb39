"""mooncake-lmcache: an LMCache remote connector backed by the mooncake-cli store.

LMCache loads `mooncake_lmcache.connector.MooncakeStoreConnector` through its
`remote_storage_plugins` config (see settings.py and the README). The other modules serve the
plugin's tests and bench: `cpu_kv` (a KV connector over a CPU tensor), `harness` (LMCache
engines on CPU), `procs` (store and redis servers in their own processes), `bench`.
"""
