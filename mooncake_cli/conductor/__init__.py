"""The conductor: cost models, the global cache index, instance state and the scheduling
policies (random, round-robin, least-load, cache-aware, kvcache-centric and ours).

Everything here is pure computation over plain records, so the live conductor and the
simulator (`mooncake bench trace --simulate`) run the very same code.
"""
