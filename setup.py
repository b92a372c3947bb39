"""The metadata is in pyproject.toml; this adds the optional C helpers (mooncake_cli/native):
without a C compiler the install goes on and the code falls back to plain copies."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mooncake_cli.native.streamcopy",
                             ["mooncake_cli/native/streamcopy.c"], optional=True)])
