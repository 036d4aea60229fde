#!/usr/bin/env bash
# Run this first on a new GPU node: the tiny task through verl's real GPU path (vLLM rollouts with
# sleep/wake and a weight sync every step, FSDP2 actor in bf16 with parameter/optimizer offload
# (OFFLOAD=0: off; the reference stays on the CPU either way: verl builds it forward-only, offloaded),
# 4 mini-batches per rollout batch, a periodic reference reset, schedule-free AdamW), a checkpoint
# and a resume. Prints the time per phase and the peak GPU memory, and fails with one line per
# problem (non-finite metric, ratio stuck at 1, KL stuck at 0, an update or a reference reset that
# changed nothing, a resume that did not continue from its checkpoint). docs/gpu-smoke.md.
#
#   bash recipe/rpg/tiny/run_tiny_gpu.sh                 # vLLM, 1 GPU, 4 steps + resume for 2
#   ROLLOUT=hf bash recipe/rpg/tiny/run_tiny_gpu.sh      # without vLLM (HF generate on the GPU)
#   GPUS=2 bash recipe/rpg/tiny/run_tiny_gpu.sh          # data parallel over 2 GPUs
#   MODEL=smol bash recipe/rpg/tiny/run_tiny_gpu.sh      # SmolLM2-135M-Instruct and its arithmetic task (docs/smol.md)
#   OFFLOAD=0 STEPS=6 RESUME_STEPS=2 bash recipe/rpg/tiny/run_tiny_gpu.sh rpg.loss.divergence=urkl
set -euo pipefail
# Run from the caller's folder (OUT=, ENTRY= and relative paths in overrides are taken from there), with this
# checkout's rpg and its lab's rpg_lab first on the path.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
export PYTHONPATH="$ROOT:$ROOT/lab${PYTHONPATH:+:$PYTHONPATH}"

PYTHON="${PYTHON:-python}"
ARGS=(--model "${MODEL:-tiny}" --rollout "${ROLLOUT:-vllm}" --gpus "${GPUS:-1}" --steps "${STEPS:-4}"
      --resume-steps "${RESUME_STEPS:-2}")
case "$(printf '%s' "${OFFLOAD:-1}" | tr '[:upper:]' '[:lower:]')" in  # strict: a typo never flips it silently
    1|true|yes|on) ;;
    0|false|no|off) ARGS+=(--no-offload) ;;
    *) echo "run_tiny_gpu.sh: OFFLOAD='${OFFLOAD}' is invalid; allowed values: 1, 0, true, false" >&2; exit 2 ;;
esac
if [[ -n "${OUT:-}" ]]; then ARGS+=(--out "$OUT"); fi

exec "$PYTHON" -m rpg_lab.demo.gpu_smoke "${ARGS[@]}" "$@"
