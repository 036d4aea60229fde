"""The GPU kit: the project's first checks on a GPU node, prepared on a machine with the package registry
(``rpg.gpu_kit.build``) and run in one time-boxed call on a node without network (``rpg.gpu_kit.run``);
standard library and pip only (docs/gpu-smoke.md, "The GPU kit").
"""

from __future__ import annotations

CARRY_DIR = ".gpu_kit"  # the carry, relative to the checkout (ignored by git; the device call carries it)
SITE_DIR = ".gpu_kit_site"  # where the run installs the carry (ignored; kept on a node between calls)
MANIFEST = "manifest.json"
CARRY_FILE = "wheels.tar.xz"
DEFAULT_BUDGET_S = 450  # a device call's command: budget + 30 s; with the machine's start, a rerun still fits 15 min
