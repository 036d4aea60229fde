"""The RPG project's lab: what the project uses to test and study itself, beside the recipe (``rpg``).

``rpg_lab.exact``: exact enumeration over small categorical distributions and sequences (float64 oracles);
``rpg_lab.conformance``: the KL-gradient conformance report (``python -m rpg_lab.conformance``);
``rpg_lab.demo``: the tiny CPU demo, the GPU smoke run and the runs' references; ``rpg_lab.study``: the studies;
``rpg_lab.gpu_kit``: the first checks on a GPU node. The recipe never imports the lab (import-linter's contract in
pyproject.toml).
"""

# the lab's folder in a checkout, holding this package: what a run from the checkout without ``pip install -e ./lab``
# puts on PYTHONPATH beside the checkout itself (the GPU kit on a node, the references' runs)
LAB_DIR = "lab"
