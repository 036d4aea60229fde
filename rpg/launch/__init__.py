"""Starting runs: run names -> Hydra overrides, the launcher, the memory plan, stop signals.

Modules (nothing is imported here, so ``import rpg.launch.<x>`` stays light):

* ``variants``     the run-name grammar: one parser for the 84 paper scripts (``parse``, ``to_overrides``).
* ``cli``          ``python -m rpg.launch``: the launcher behind ``recipe/rpg/{7b,4b}/*.sh`` (local, Ray
                   job, ``DRY_RUN=1``, ``RPG_BACKEND=cpu``, ``--describe``, ``--list``).
* ``overrides``    Hydra override lists read with Hydra's own parser: keys, values, merging (later wins),
                   one-line syntax errors.
* ``harness``      run the trainer here in a subprocess (CPU backend, GPU smoke run): process tree, output
                   directory, metrics history, stop handling, the tether that stops a trainer (SIGTERM)
                   when its launcher dies, even by SIGKILL (a package: one module per concern).
* ``run_env``      the environment every local run sets.
* ``memory``       per-GPU memory and checkpoint-disk estimate of a composed config.
* ``memory_host``  host RAM per node of the same config; ``report``, the whole plan the launcher prints.
* ``signals``      SIGHUP/SIGINT/SIGTERM -> a clean stop of the whole run (exit 128 + signum).
"""
