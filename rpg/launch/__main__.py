"""``python -m rpg.launch [+experiment=<run>] [hydra overrides] [--describe]``: the paper runs' launcher
(``rpg.launch.entry.cli``; what recipe/rpg/launch.sh runs, docs/launch-scripts.md)."""

import sys

from rpg.launch.entry import cli

sys.exit(cli(sys.argv[1:]))
