"""A small reproduction study on the tiny task, runnable without a GPU: ``python -m rpg.study``.

It runs a grid of methods x seeds through verl's real trainer on the CPU backend (the path of
``RPG_BACKEND=cpu``: ``rpg.launch.plan.plan_overrides`` + ``rpg.launch.harness.run_trainer``)
in the off-policy regime (several optimizer steps per rollout batch), plus an off-policy stress
axis for RPG-REINFORCE with and without RPG-Style Clip, and renders a Last/Best table (mean ± std
over seeds) and training curves with ``rpg.reports``.

* ``rpg.study.grid``: methods (paper run names parsed by ``rpg.launch.variants``), the tiny-task
  adaptation, the grid, run identities and the time estimate.
* ``rpg.study.records``: each run's folder and ``run.json``, its identity (``rpg.study.identity``: its settings
  wherever its folders are) and what a study finds before it starts.
* ``rpg.study.runner``: runs the grid resumably (a finished run is not repeated), with progress.
* ``rpg.study.render``: tables and figures from the finished runs' logs.

docs/study.md has the command, the committed results and their reading.
"""
