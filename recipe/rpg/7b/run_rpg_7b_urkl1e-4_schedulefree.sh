#!/usr/bin/env bash
# Paper run: its settings are recipe/rpg/config/experiment/<this file name>.yaml, written from the name
# (rpg/launch/variants.py; python -m rpg.launch.experiments --write) and launched with +experiment=<name>.
exec bash "$(dirname "$0")/../launch.sh" "$(basename "$0" .sh)" "$@"
