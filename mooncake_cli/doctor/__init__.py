"""`mooncake doctor`: checks that find the usual causes of RDMA, etcd, master, memory and
network trouble, each with its evidence and fix.

    from mooncake_cli.doctor.runner import run
    checks = run(DoctorConfig(metadata="etcd://10.0.0.5:2379"))   # list[Check]

This package imports only the records; the probes load with `runner`.
"""

from mooncake_cli.doctor.check import GROUP_NAMES, Check, DoctorConfig, DoctorFailed, Status

__all__ = ["GROUP_NAMES", "Check", "DoctorConfig", "DoctorFailed", "Status"]
