"""CPU backend for verl 0.9.1 (platform ``cpu``, FSDP2 on gloo, ``rollout.name=hf``).

Importing this package does nothing. The backend is switched on per process by
``VERL_PLATFORM=cpu`` together with ``VERL_USE_EXTERNAL_MODULES=rpg.backends.cpu.external_module``;
``rpg.backends.cpu.env_overrides`` provides both, plus the Hydra overrides, and
``rpg.launch.harness.run_trainer`` runs the trainer with them. See docs/cpu-backend.md.
"""
