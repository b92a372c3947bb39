"""The scheduler: cost models, the global cache index, instance state and the scheduling
policies (random, round-robin, least-load, cache-aware, kvcache-centric and ours).

Everything here is pure computation over plain records (no sockets, HTTP or etcd), so the live
conductor (`mooncake_cli.conductor`) and the simulator (`mooncake_cli.sim`) run the very same
code.
"""
