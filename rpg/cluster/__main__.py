"""``python -m rpg.cluster <run> [hydra overrides]``: submit a paper run to the Ray cluster at ``RAY_ADDRESS``."""

import sys

from rpg.cluster.submit import main

sys.exit(main())
