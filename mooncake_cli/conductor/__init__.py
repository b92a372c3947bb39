"""The live conductor: the OpenAI front, the worker registry and its etcd watch, the KV-event
indexer, peers and bookings. It places requests with the pure scheduler
(`mooncake_cli.scheduler`).
"""
