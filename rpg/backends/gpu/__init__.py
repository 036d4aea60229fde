"""The tiny task on CUDA through verl's real GPU path: ``python -m rpg.backends.gpu.smoke``
(recipe/rpg/tiny/run_tiny_gpu.sh), "run this first on a new node" (docs/gpu-smoke.md).

Importing this package does nothing; ``settings`` holds the smoke run's GPU overrides,
``smoke_checks`` the pure pass/fail rules on its metrics, ``register`` the CUDA registration of
``rollout.name=hf``, ``preflight`` the checks of this node that the driver runs before Ray.
"""
