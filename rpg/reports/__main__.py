"""``python -m rpg.reports {tables,curves} ...`` (rpg.reports.cli; docs/data-and-reports.md)."""

import sys

from rpg.reports.cli import main

if __name__ == "__main__":
    sys.exit(main())
