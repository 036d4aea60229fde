"""A paper run's launch on one node, in the driver's process (``recipe/rpg/main_rpg.py +experiment=<run>``): its
experiment file, the environment's paths and sizes, the checks and the header before anything starts, the dry run
and the CPU rehearsal (docs/launch-scripts.md). Nothing is imported here, so that a module of it stays light.
"""
