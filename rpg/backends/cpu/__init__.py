"""CPU backend for verl 0.9.1: platform ``cpu``, FSDP2 on gloo, ``rollout.name=hf`` (docs/cpu-backend.md).

Importing this package does nothing: a run's processes switch it on through the environment and Hydra overrides
of ``rpg.backends.cpu.env_overrides``.
"""
