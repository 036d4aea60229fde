#!/usr/bin/env python
"""Same as ``python -m rpg.reports curves``: draw the training-dynamics figure (Fig. 4 layout).

    python -m rpg.reports curves RPG-UFKL=logs/ufkl.jsonl DAPO=tensorboard_log/rpg/dapo --out fig/curves
"""

import sys

from rpg.reports.cli import main_plot

if __name__ == "__main__":
    sys.exit(main_plot())
