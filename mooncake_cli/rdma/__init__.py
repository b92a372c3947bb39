"""RDMA support shared by the doctor and the RDMA transport: device discovery (sysfs, pyverbs)."""
