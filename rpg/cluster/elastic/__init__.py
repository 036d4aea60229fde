"""The elastic supervisor: a run submitted with ``NNODES=MIN:MAX`` goes on by itself after a node is lost, and
grows back at a checkpoint when nodes return (docs/launch-scripts.md#elastic-runs-nnodesminmax). The entrypoint of its Ray job:
``python -m rpg.cluster.elastic --nnodes MIN:MAX --sizes K,... --max-restarts R -- PYTHON main_rpg.py OVERRIDES``.
"""
