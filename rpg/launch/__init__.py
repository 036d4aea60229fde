"""The paper runs' launcher on one node, ``python -m rpg.launch +experiment=<run>`` (what recipe/rpg/launch.sh runs;
``rpg.launch.entry``): a run's experiment file, the environment's paths and sizes, the checks and the header before
anything starts, the dry run, the memory plan and the CPU rehearsal (docs/launch-scripts.md). Nothing is imported
here, so that a module of it stays light.
"""
