"""``python -m rpg.launch [+experiment=<run>] [hydra overrides] [--describe]``: the paper runs' launcher
(``rpg.launch.entry.cli``, which recipe/rpg/main_rpg.py hands a paper run to; docs/launch-scripts.md)."""

import sys

from rpg.launch.entry import cli

sys.exit(cli(sys.argv[1:]))
