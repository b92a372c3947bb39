#!/usr/bin/env bash
# CI step of the LMCache plugin, run by .ci/run after the core tests (scripts/setup.sh has
# installed mooncake-cli): redis-server (apt) for the bench's redis:// peer, LMCache 0.5.6 beside
# the CPU torch (pinned, or pip could swap in a multi-GB CUDA build), this plugin, its tests.
set -euo pipefail
cd "$(dirname "$0")"

SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi
if ! command -v redis-server >/dev/null; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server
fi
# the tests and the bench start their own redis-server on a free port
$SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true

PY="${PYTHON:-python3}"
if ! "$PY" -c "import mooncake_cli" 2>/dev/null; then
    echo "error: mooncake-cli is not installed for $PY: run ./scripts/setup.sh first" >&2
    exit 1
fi
"$PY" -m pip install -q 'torch==2.13.0' 'lmcache==0.5.6' -e '.[test]'
"$PY" -m pytest -q
