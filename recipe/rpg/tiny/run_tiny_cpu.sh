#!/usr/bin/env bash
# The tiny end-to-end demo: verl's real trainer (Ray + Hydra + FSDP2 workers + HF rollout + DAPO
# math reward + validation) on the CPU backend, with a tiny locally built model and task.
# Prints progress and validation accuracy before/after; writes metrics.jsonl, summary.json and
# training_curve.png to the checkout's outputs/tiny_cpu/<time>/ (or OUT=..., relative to the current folder).
# A few minutes on 2 cores.
#
#   bash recipe/rpg/tiny/run_tiny_cpu.sh                      # 30 steps of RPG-REINFORCE-UFKL, RPG-Style Clip
#   ALGO=grpo bash recipe/rpg/tiny/run_tiny_cpu.sh            # verl's stock GRPO (k3 KL loss, fixed reference)
#   STEPS=10 bash recipe/rpg/tiny/run_tiny_cpu.sh rpg.loss.divergence=urkl   # any Hydra override
#   GPUS=2 bash recipe/rpg/tiny/run_tiny_cpu.sh              # two FSDP ranks (gloo; 1, 2, 4, 8 or 16)
#   ROLLOUT=vllm PYTHON=.venv-vllm/bin/python bash recipe/rpg/tiny/run_tiny_cpu.sh   # verl's vLLM rollout
#     (vLLM's CPU build, in the environment of scripts/setup_vllm_cpu.sh; docs/cpu-backend.md)
set -euo pipefail
# Run from the caller's folder (OUT=, ENTRY= and relative paths in overrides are taken from there), with this
# checkout's rpg and its lab's rpg_lab first on the path.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
export PYTHONPATH="$ROOT:$ROOT/lab${PYTHONPATH:+:$PYTHONPATH}"

PYTHON="${PYTHON:-python}"
ARGS=(--algo "${ALGO:-rpg}")
if [[ -n "${MODEL:-}" ]]; then ARGS+=(--model "$MODEL"); fi  # tiny (default) or smol: SmolLM2 (docs/smol.md)
if [[ -n "${STEPS:-}" ]]; then ARGS+=(--steps "$STEPS"); fi  # default 30 (smol: rpg.smol.overrides.STEPS)
# TEST_FREQ: default 10 (smol: rpg.smol.overrides.TEST_FREQ)
if [[ -n "${TEST_FREQ:-}" ]]; then ARGS+=(--test-freq "$TEST_FREQ"); fi
if [[ -n "${ENTRY:-}" ]]; then ARGS+=(--entry "$ENTRY"); fi
if [[ -n "${OUT:-}" ]]; then ARGS+=(--out "$OUT"); fi
if [[ -n "${ROLLOUT:-}" ]]; then ARGS+=(--rollout "$ROLLOUT"); fi
if [[ -n "${GPUS:-}" ]]; then ARGS+=(--gpus "$GPUS"); fi

exec "$PYTHON" -m rpg_lab.demo.cpu "${ARGS[@]}" "$@"
