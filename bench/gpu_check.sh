#!/usr/bin/env bash
# One command, the first time a GPU machine is available: set up a virtual environment with a CUDA build of
# PyTorch, slimecli and megatron-core, then run bench/gpu_check.py (the torch and megatron trainers and the
# teacher on the GPU; tokens/s and peak GPU memory per back-end) within 10 minutes. Exit 1 on any failure.
#
#   bench/gpu_check.sh [gpu_check.py options]     e.g. --steps 8 --model-path /ckpt/qwen3-0.6b --json out.json
#   SKIP_SETUP=1 bench/gpu_check.sh               use the current python (slimecli and megatron-core installed)
#   TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "gpu_check: $*" >&2; exit 1; }
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: this script needs an NVIDIA GPU machine"
nvidia-smi -L || die "nvidia-smi sees no GPU"
if [ "${SKIP_SETUP:-0}" = 1 ]; then
  PY=${PYTHON:-python3}
else
  VENV=${VENV:-.venv-gpu}
  TORCH=${TORCH:-torch==2.13.0}  # PyPI's Linux build of this release is a CUDA build (constraints.txt pins 2.13.0)
  [ -x "$VENV/bin/python" ] || ${PYTHON:-python3} -m venv "$VENV" || die "cannot create $VENV"
  "$VENV/bin/pip" install -q --upgrade pip || die "pip upgrade failed"
  # shellcheck disable=SC2086  # TORCH may carry pip options (an index URL)
  "$VENV/bin/pip" install -q -c constraints.txt $TORCH || die "installing $TORCH failed"
  "$VENV/bin/pip" install -q -c constraints.txt -e ".[megatron]" || die "installing slimecli[megatron] failed"
  PY="$VENV/bin/python"
fi
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "this torch build has no CUDA")' \
  || die "set TORCH to a CUDA build of PyTorch (see the header of this script)"
"$PY" -c 'import megatron.core' || die "megatron-core is not importable"
exec timeout 600 "$PY" bench/gpu_check.py "$@"
