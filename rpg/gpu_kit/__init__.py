"""The GPU kit: the project's first checks on a GPU node, prepared on a machine with the package registry and
run in one call on a node without network (docs/gpu-smoke.md, "The GPU kit").

``python -m rpg.gpu_kit.build`` (with the registry) writes the carry: the wheels the node lacks, for its Python
and platform, trimmed and packed under ``.gpu_kit/``. ``python3 -m rpg.gpu_kit.run --out DIR`` (on the node)
installs the carry into ``.gpu_kit_site/`` and runs the checks, each in its own time box, writing
``DIR/summary.json`` after each. Both use the standard library and pip only, so that they run before anything
is installed.
"""

from __future__ import annotations

CARRY_DIR = ".gpu_kit"  # the carry, relative to the checkout (ignored by git; the device call carries it)
SITE_DIR = ".gpu_kit_site"  # where the run installs the carry (ignored; kept on a node between calls)
MANIFEST = "manifest.json"
CARRY_FILE = "wheels.tar.xz"
