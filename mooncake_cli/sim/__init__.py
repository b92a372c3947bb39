"""The simulator behind `mooncake bench trace --simulate`: a Mooncake-format trace (`trace`)
replayed through the pure scheduler (`mooncake_cli.scheduler`) on a simulated cluster of
batching instances (`events`, `batch`, `cluster`), shaped by `settings`; `run` drives it and
`metrics` summarizes it. It imports nothing of the live conductor or the benchmarks.
"""
