#!/usr/bin/env bash
# The tiny end-to-end demo: verl's real trainer (Ray + Hydra + FSDP2 workers + HF rollout + DAPO
# math reward + validation) on the CPU backend, with a tiny locally built model and task.
# Prints progress and validation accuracy before/after; writes metrics.jsonl, summary.json and
# training_curve.png to outputs/tiny_cpu/<time>/ (or OUT=...). About 3-5 minutes on 2 cores.
#
#   bash recipe/rpg/tiny/run_tiny_cpu.sh                          # 30 steps of verl's GRPO (k3 KL loss, fixed ref)
#   STEPS=10 bash recipe/rpg/tiny/run_tiny_cpu.sh actor_rollout_ref.actor.optim.lr=5e-4   # any Hydra override
#   ENTRY=recipe/rpg/main_rpg.py bash recipe/rpg/tiny/run_tiny_cpu.sh ...                   # another trainer entry
set -euo pipefail
cd "$(dirname "$0")/../../.."

PYTHON="${PYTHON:-python}"
ENTRY="${ENTRY:-verl.trainer.main_ppo}"
STEPS="${STEPS:-30}"
TEST_FREQ="${TEST_FREQ:-5}"
ARGS=(--entry "$ENTRY" --steps "$STEPS" --test-freq "$TEST_FREQ")
if [[ -n "${OUT:-}" ]]; then ARGS+=(--out "$OUT"); fi

exec "$PYTHON" -m rpg.backends.cpu.run "${ARGS[@]}" "$@"
