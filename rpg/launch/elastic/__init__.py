"""The elastic supervisor: a run submitted with ``NNODES=MIN:MAX`` goes on by itself after a node is lost.

``python -m rpg.launch.elastic --nnodes MIN:MAX --sizes K,... --max-restarts R -- PYTHON main_rpg.py OVERRIDES``
is the Ray job's entrypoint (``rpg.launch`` submits it; Ray's job supervisor runs it on the head, so no client
needs to stay). It holds the checkpoint folder (``rpg.verl.folder_lock``) for the whole run, records its PID in
``<checkpoints>/.rpg_elastic/supervisor.json`` and starts the trainer (the driver, ``main_rpg.py``) as its child,
in its process group (``ray job stop`` and Ray's kill of the job's group reach both; the child also gets SIGTERM
if the supervisor dies), at the largest count in ``--sizes`` (the counts of [MIN, MAX] that pass the driver's
rules at the run's global batch, checked by the launcher: ``rpg.launch.node_plan``) that the nodes with free GPUs
can hold. Only ``trainer.nnodes`` and the per-GPU micro-batches change between counts (``rpg.common.nnodes``).

* **A node lost**: the trainer writes why (``ELASTIC_STATUS_ENV``) and exits ``ELASTIC_EXIT``; a trainer that
  has not noticed within ``HANG_S`` while fewer nodes than it runs on are alive (verl waiting on a placement group
  or a collective) is stopped and counts as one too. While restarts are left (``--max-restarts``; as torchrun's,
  node losses count, growing does not) the supervisor waits for the old trainer's Ray job to be gone (its actors
  dead, its placement groups removed: none of its workers writes into the checkpoint folder any more), for MIN
  nodes (up to ``WAIT_FOR_NODES_S``), and restarts it from the last complete checkpoint (``trainer.resume_mode=auto``:
  resharded to the new world size as any resume is) with one line: why, the node, world size old -> new, the step
  resumed, the logged steps trained again, restarts left. Otherwise: the trainer's stop line (its resume command
  asks for an ``NNODES`` the cluster can hold), exit 1.
* **Nodes back**: when the nodes can hold a larger count (each alive node counted once: its GPUs free, or held by
  the running trainer's placement groups: ``cluster.run_nodes``), the supervisor waits for the next complete
  checkpoint, stops the trainer (SIGTERM, after a grow request the trainer reads: one neutral line) and restarts it
  at the larger count, one line saying so; not when that checkpoint is the run's last step (its marker's
  ``last_step``: the trainer only validates and ends).
* **Before every start**, step folders above the last complete checkpoint without its marker (a save cut short)
  are renamed ``global_step_N.incomplete-aK``, never deleted: saving into one again would mix two world sizes.
* **Stopped** (``ray job stop``: SIGTERM to the job's processes): the trainer prints its stop line; the supervisor
  waits for it and exits 128 + signum, restarting nothing.

Modules: ``attempts`` (the command line, each attempt's command and environment, the checkpoint folder's state),
``cluster`` (what the supervisor asks of Ray), ``supervisor`` (the decisions), ``__main__`` (the entrypoint).
"""
