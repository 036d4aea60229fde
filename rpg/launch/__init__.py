"""The paper runs' launcher on one node (``rpg.launch.entry``: recipe/rpg/main_rpg.py hands it a paper run; also
``python -m rpg.launch +experiment=<run>``): a run's experiment file, the environment's paths and sizes, the checks
and the header before anything starts, the dry run, the memory plan and the CPU rehearsal (docs/launch-scripts.md).
Nothing is imported here, so that a module of it stays light.
"""
