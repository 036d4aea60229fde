"""The tiny task's two runs, applications on top of the launcher (``rpg.launch.harness``):

* ``python -m rpg.demo.cpu`` (recipe/rpg/tiny/run_tiny_cpu.sh): the tiny model learns the tiny task on the
  CPU backend, a curve in a few minutes (docs/cpu-backend.md);
* ``python -m rpg.demo.gpu_smoke`` (recipe/rpg/tiny/run_tiny_gpu.sh): the same task on CUDA through verl's real
  GPU path, "run this first on a new node" (docs/gpu-smoke.md); ``smoke_settings`` its overrides and their
  checks, ``smoke_checks`` the pass/fail rules on its metrics.
"""
