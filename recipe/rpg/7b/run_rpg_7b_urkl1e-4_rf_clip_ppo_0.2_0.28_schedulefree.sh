#!/usr/bin/env bash
# Paper run: every setting comes from this file name (rpg/launch/variants.py; docs/launch-scripts.md).
exec bash "$(dirname "$0")/../launch.sh" "$(basename "$0" .sh)" "$@"
