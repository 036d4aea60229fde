#!/usr/bin/env python
"""Same as ``python -m rpg.data``: prepare the training / evaluation parquet files.

    python scripts/prepare_data.py prepare-all --out-dir data/
"""

import sys

from rpg.data.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
