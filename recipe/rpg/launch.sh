#!/usr/bin/env bash
# Shared launcher of recipe/rpg/{7b,4b}/*.sh: `python -m rpg.launch <run name> [hydra overrides]`.
# A run's settings come from its name alone (rpg/launch/variants.py), written out in
# recipe/rpg/config/experiment/<run name>.yaml (composed with +experiment=<run name>); show them with
#   python -m rpg.launch --describe <run name>
# Environment (MODEL_PATH, DATA_DIR, CKPTS_DIR, NNODES, RAY_ADDRESS, DRY_RUN, RPG_BACKEND, ...):
# docs/launch-scripts.md.
set -euo pipefail
exec "${PYTHON:-python3}" -m rpg.launch "$@"
