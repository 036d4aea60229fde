#!/usr/bin/env python
"""Same as ``python -m rpg.reports tables``: print a paper table (3, 5, 6, 7, 8) from run logs.

    python -m rpg.reports tables RPG-UFKL=logs/ufkl.jsonl DAPO=logs/dapo.csv --table 3 --format markdown
"""

import sys

from rpg.reports.cli import main_tables

if __name__ == "__main__":
    sys.exit(main_tables())
