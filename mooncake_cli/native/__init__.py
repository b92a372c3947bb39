"""Compiled helpers, each optional: built at install when a C compiler is there (setup.py),
with a pure-Python fallback otherwise."""
