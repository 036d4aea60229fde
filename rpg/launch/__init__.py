"""Starting runs: the paper's run names as Hydra overrides, the launcher behind the paper scripts
(``python -m rpg.launch``), the local run harness, the memory plan, Ray jobs and the elastic supervisor
(docs/launch-scripts.md). Nothing is imported here, so that ``import rpg.launch.<module>`` stays light.
"""
