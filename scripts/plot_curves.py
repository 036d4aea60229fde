#!/usr/bin/env python
"""Draw the training-dynamics figure (mean@32 AIME24/AIME25, reward, entropy, response length).

    python scripts/plot_curves.py RPG-UFKL=logs/ufkl.jsonl DAPO=tensorboard_log/rpg/dapo --out fig/curves
"""

import sys

from rpg.reports.cli import main_plot

if __name__ == "__main__":
    sys.exit(main_plot())
