#!/usr/bin/env bash
# The paper scripts' runner: `recipe/rpg/launch.sh RUN [hydra overrides]` runs
#   python recipe/rpg/main_rpg.py +experiment=RUN [hydra overrides]
# RUN's settings: its experiment file (in recipe/rpg/config/experiment/). With RAY_ADDRESS set, the run is submitted
# to that Ray cluster instead (python -m rpg.cluster RUN, the opt-in cluster layer). docs/launch-scripts.md.
set -euo pipefail
if [[ $# -lt 1 ]]; then echo "usage: recipe/rpg/launch.sh RUN [hydra overrides]" >&2; exit 2; fi
run="$1"
shift
if [[ -n "${RAY_ADDRESS:-}" ]]; then exec "${PYTHON:-python3}" -m rpg.cluster "$run" "$@"; fi
exec "${PYTHON:-python3}" "$(dirname "$0")/main_rpg.py" "+experiment=$run" "$@"
