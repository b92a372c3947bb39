"""vLLM's own Mooncake connectors (MooncakeConnector, MooncakeStoreConnector) on mooncake-cli:
`mooncake.store` and `mooncake.engine` come from the mooncake-compat import hook; this package
only carries the one CPU workaround vLLM 0.32.0 needs (cpu_accelerator_index.py)."""
