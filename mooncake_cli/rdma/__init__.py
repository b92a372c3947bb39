"""RDMA device discovery (sysfs, pyverbs) for `mooncake doctor`; transfers over RDMA go through
the nixl plugin's UCX."""
