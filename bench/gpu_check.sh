#!/usr/bin/env bash
# One command, the first time a GPU machine is available: set up a virtual environment with slimecli and
# megatron-core, then run bench/gpu_check.py (the torch and megatron trainers in fp32 and bf16, the embedded
# engine and the teacher on the GPU; tokens/s and peak GPU memory per case) within 8 minutes. Exit 1 on any failure.
#
#   bench/gpu_check.sh [gpu_check.py options]     e.g. --steps 8 --model-path /ckpt/qwen3-0.6b --json out.json
#   bench/gpu_check.sh --offline WHEELHOUSE [...] no network: reuse the machine's CUDA PyTorch (a venv with system
#                                                 site packages) and install the rest from `make wheelhouse`'s
#                                                 directory with pip --no-index
#   SKIP_SETUP=1 bench/gpu_check.sh               use the current python (slimecli and megatron-core installed)
#   TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "gpu_check: $*" >&2; exit 1; }
WHEELHOUSE=
if [ "${1:-}" = --offline ]; then
  [ $# -ge 2 ] || die "--offline needs the wheelhouse directory (make wheelhouse)"
  WHEELHOUSE=$2
  shift 2
fi
# No GPU, no check: stop before anything is installed.
command -v nvidia-smi >/dev/null 2>&1 || die "no GPU here: nvidia-smi not found (this check needs an NVIDIA GPU machine)"
nvidia-smi -L >/dev/null 2>&1 || die "no GPU here: nvidia-smi sees no GPU (nvidia-smi -L failed)"
nvidia-smi -L
SYSPY=${PYTHON:-python3}
if [ -n "$WHEELHOUSE" ]; then
  ls "$WHEELHOUSE"/slimecli-*.whl "$WHEELHOUSE/requirements.txt" >/dev/null 2>&1 \
    || die "$WHEELHOUSE holds no slimecli wheel and requirements.txt: make wheelhouse first"
  "$SYSPY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
    || die "--offline reuses the machine's CUDA PyTorch, but $SYSPY has none (import torch; torch.cuda.is_available())"
  VENV=${VENV:-.venv-gpu}
  [ -x "$VENV/bin/python" ] || "$SYSPY" -m venv --system-site-packages "$VENV" || die "cannot create $VENV"
  # exactly the wheelhouse's pins, over what the machine has (its torch, transformers, numpy: see bench/wheelhouse.py)
  "$VENV/bin/pip" install -q --no-index --find-links "$WHEELHOUSE" --no-deps -r "$WHEELHOUSE/requirements.txt" \
    "$(ls "$WHEELHOUSE"/slimecli-*.whl | tail -1)" || die "installing from $WHEELHOUSE failed"
  "$VENV/bin/python" -c 'import transformers, tokenizers, safetensors, numpy, yaml' 2>/dev/null \
    || die "the machine lacks transformers or its requirements, which the wheelhouse leaves out: make wheelhouse WHEELHOUSE_ALL=1"
  PY="$VENV/bin/python"
elif [ "${SKIP_SETUP:-0}" = 1 ]; then
  PY=$SYSPY
else
  VENV=${VENV:-.venv-gpu}
  TORCH=${TORCH:-torch==2.13.0}  # PyPI's Linux build of this release is a CUDA build (constraints.txt pins 2.13.0)
  [ -x "$VENV/bin/python" ] || "$SYSPY" -m venv "$VENV" || die "cannot create $VENV"
  "$VENV/bin/pip" install -q --upgrade pip || die "pip upgrade failed"
  # shellcheck disable=SC2086  # TORCH may carry pip options (an index URL)
  "$VENV/bin/pip" install -q -c constraints.txt $TORCH || die "installing $TORCH failed"
  "$VENV/bin/pip" install -q -c constraints.txt -e ".[megatron]" || die "installing slimecli[megatron] failed"
  PY="$VENV/bin/python"
fi
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "this torch build has no CUDA")' \
  || die "set TORCH to a CUDA build of PyTorch (see the header of this script)"
"$PY" -c 'import megatron.core' || die "megatron-core is not importable"
# the checkout's slimecli runs (python -m slimecli from the repository root), whatever the venv installed
exec timeout 480 "$PY" bench/gpu_check.py "$@"
