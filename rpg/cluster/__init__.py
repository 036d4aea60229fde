"""The opt-in cluster layer, off the single-node path: a paper run submitted as a Ray job (``python -m rpg.cluster``,
what recipe/rpg/launch.sh runs with ``RAY_ADDRESS``), the node counts it may take, and the elastic supervisor of
``NNODES=MIN:MAX`` (docs/launch-scripts.md, sections 5 and 6).
"""
