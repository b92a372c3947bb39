"""vLLM's own Mooncake connectors (MooncakeConnector, MooncakeStoreConnector) on mooncake-cli:
`mooncake.store` and `mooncake.engine` come from the mooncake-compat import hook; this package
carries the one CPU workaround vLLM 0.32.0 needs (cpu_accelerator_index.py) and the `vllm`
engine of `mooncake prefill` / `mooncake decode` (engines.py: vLLM's AsyncLLM in the role's
process, worker.py, prefill.py, decode.py)."""
