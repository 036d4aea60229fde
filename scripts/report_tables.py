#!/usr/bin/env python
"""Print a paper table (3, 5, 6, 7, 8) from run logs next to the published numbers.

    python scripts/report_tables.py RPG-UFKL=logs/ufkl.jsonl DAPO=logs/dapo.csv --table 3 --format markdown
"""

import sys

from rpg.reports.cli import main_tables

if __name__ == "__main__":
    sys.exit(main_tables())
