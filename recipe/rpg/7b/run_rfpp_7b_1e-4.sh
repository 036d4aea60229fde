#!/usr/bin/env bash
# Paper run recipe/rpg/config/experiment/<this file name>.yaml (docs/launch-scripts.md).
exec bash "$(dirname "$0")/../launch.sh" "$(basename "$0" .sh)" "$@"
