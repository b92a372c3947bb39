"""Serving workers: `mooncake prefill` (prefix reuse, chunked prefill, KV streaming) and
`mooncake decode` (KV reservations and continuous batching), both behind JSON-over-HTTP."""
