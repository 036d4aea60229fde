"""GPU backend: verl's own CUDA path (vLLM rollouts, FSDP actors); its interface is ``backend``.

Importing this package does nothing; ``settings`` holds the run environment, ``register`` the CUDA
registration of ``rollout.name=hf``, ``preflight`` the checks of this node that the driver runs
before Ray. The tiny GPU smoke run that exercises it is an application: ``rpg.demo.gpu_smoke``.
"""
