"""verl 0.9.1 glue for RPG (docs/verl-integration.md).

Modules (import only what you need; nothing is imported here so that `import rpg.verl`
stays free of verl's heavy trainer/worker stack):

* ``settings``       ``loss_config``: the library's ``RPGLossConfig`` from a verl actor config (driver and
                     workers alike).
* ``translate``      ``validate_and_apply``: the ``rpg:`` block (declared in ``rpg.config``) parsed, then
                     ``apply_to_verl_config``: the verl keys its settings imply (driver).
* ``checks``         the ``rpg:`` settings against verl's own keys (trainer mode, reference copies, reward).
* ``describe``       the one line the driver prints about what will run.
* ``policy_config``  ``RPGPolicyLossConfig``: verl ``PolicyLossConfig`` subclass carrying the
                     ``rpg.loss`` values to the workers (``actor_rollout_ref.actor.policy_loss``).
* ``register``       registrations with verl's registries (policy losses, advantage estimators);
                     imported by the ``verl.plugins`` entry point in every process.
* ``policy_loss``    ``rpg_policy_loss``: the registered policy loss (RPG / GRPO-corrected), verl's signature.
* ``actor_loss``     ``rpg_actor_loss``: verl's ``ppo_loss`` handing ``ref_log_prob`` (and, with a stale
                     sampler, the behaviour weights pi_old/mu) to it.
* ``worker``         ``RPGActorRolloutRefWorker``: loss install, reference sync, schedule-free modes.
* ``trainer``        ``RPGTrainer`` / ``RPGTrainerColocateAsync``: reference schedule, schedule-free switches,
                     metrics, on verl's sync or colocate-async trainer.
* ``main``           ``RPGTaskRunner`` and the Hydra driver used by ``recipe/rpg/main_rpg.py``.
* ``preflight``      input paths and run names checked in the driver before Ray.
* ``checkpoints``    which checkpoint a resume loads (complete and intact), decided before Ray.
"""
