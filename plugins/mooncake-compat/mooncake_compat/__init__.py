"""`import mooncake.store` served by mooncake_cli.compat.store where upstream's wheel is absent
(hook.py; installed at interpreter start by mooncake_compat.pth)."""
