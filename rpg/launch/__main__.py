"""``python -m rpg.launch``: see ``rpg.launch.cli``."""

import sys

from rpg.launch.cli import main

sys.exit(main())
