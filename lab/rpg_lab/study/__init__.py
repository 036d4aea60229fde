"""A small reproduction study on the tiny task, runnable without a GPU (``python -m rpg_lab.study``): grids of methods x
seeds through verl's real trainer on the CPU backend, rendered as tables and figures by ``rpg.reports``
(docs/study.md).
"""
