"""The driver's checks of the ``rpg:`` settings against verl's own keys, before Ray (one line each).

``rpg.verl.block_to_verl.apply_to_verl_config`` runs them before it writes any verl key: the trainer mode and, with a
stale sampler μ, what keeps the loss exact (the weights π_old/μ applied once, never dropped; ``check_trainer``,
``check_separate_async``); the reference copies (the same engine and shard layout on both sides, no LoRA, and the
probe of ``rpg.reference.log_weight_diff`` without Ulysses sequence parallelism or fused kernels;
``check_reference_copies``); the reward (a function name needs its path; ``rpg.reward``'s options).
"""

from __future__ import annotations

from rpg.backends.gpu.env_overrides import ENGINE_NAME as GPU_ENGINE
from rpg.config import RPGLossConfig, RPGSettings, config_value, ulysses_sizes
from rpg.config.access import RPGConfigError, fail as _fail


def check_trainer(cfg, settings: RPGSettings) -> bool:
    """verl's v1 trainer in a mode the recipe runs (``check_trainer_mode``), no distillation. Returns True
    for a stale sampler (``colocate_async``, ``separate_async``)."""
    if not config_value(cfg, "trainer.use_v1", True):
        _fail("trainer.use_v1=False is not supported by the RPG recipe (it extends verl's v1 trainer); "
              "allowed: trainer.use_v1=True")
    stale = check_trainer_mode(cfg, settings)
    if config_value(cfg, "distillation.enabled", False):
        _fail("distillation.enabled=True is not supported together with the RPG recipe")
    return stale


def check_reference_copies(cfg, settings: RPGSettings) -> None:
    """A reference that is overwritten with actor weights (``ReferenceSettings.resets``): fsdp or fsdp2 on
    both sides with the same engine and shard layout, a separate reference model (no LoRA), and no Ulysses
    sequence parallelism when ``log_weight_diff`` probes the copy."""
    actor = "actor_rollout_ref.actor"
    ref = settings.reference
    if not ref.resets:
        return
    strategy = config_value(cfg, f"{actor}.strategy", "fsdp")
    lora_rank = config_value(cfg, "actor_rollout_ref.model.lora.rank", 0) or config_value(cfg, "actor_rollout_ref.model.lora_rank", 0)
    ref_in_actor = bool(lora_rank and lora_rank > 0) or config_value(cfg, "actor_rollout_ref.model.lora_adapter_path") is not None
    if strategy not in ("fsdp", "fsdp2"):
        _fail(f"rpg.reference.mode={ref.mode} copies actor weights into the reference and supports "
              f"{actor}.strategy fsdp or fsdp2 only (got {strategy!r})")
    # the FSDP version each engine runs: verl's FSDPActorConfig.__post_init__ overwrites
    # fsdp_config.strategy with the role's own strategy (verl/workers/config/actor.py:325), for the
    # actor and for the reference, whose config is built the same way (verl/workers/engine_workers.py:553;
    # ref.strategy defaults to the actor's, verl/trainer/config/ref/ref.yaml:5)
    a_eng = strategy
    r_eng = config_value(cfg, "actor_rollout_ref.ref.strategy", a_eng)
    if a_eng != r_eng:
        _fail(f"rpg.reference.mode={ref.mode} copies actor shards into the reference: "
              f"{actor}.strategy={a_eng!r} and actor_rollout_ref.ref.strategy={r_eng!r} must be equal")
    check_reference_shard_layout(cfg, ref.mode, a_eng)
    if ref.log_weight_diff:
        check_probe_without_sequence_parallelism(cfg)
        check_probe_without_fused_kernels(cfg)
    if ref_in_actor:
        _fail(f"rpg.reference.mode={ref.mode} needs a separate reference model; LoRA (reference = actor "
              "without adapter) is not supported; allowed modes with LoRA: sampler, fixed")


def check_reference_shard_layout(cfg, mode: str, engine_strategy: str) -> None:
    """Everything that decides the reference's local shard shapes must equal the actor's (the reset
    copies rank-local shards). Checked here so a mismatch fails before Ray, not at the first reset.

    * ``fsdp_size``: the shard group (``verl.workers.engine.fsdp.utils.create_device_mesh``: a size
      < 0 or >= the world size shards over all ranks, otherwise over groups of that size);
    * FSDP1 only: ``wrap_policy`` (which modules form a flat parameter) and ``use_orig_params``
      (flat parameters or per-parameter views). FSDP2 shards each parameter on its own, so these do
      not change its shards.

    Not needed: ``reshard_after_forward`` (the copy releases gathered parameters first,
    ``rpg.verl.reference_copy``), ``model_dtype`` (the copy casts), offload settings (placement only).
    """
    from omegaconf import OmegaConf

    a, r = "actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config"
    world = int(config_value(cfg, "trainer.n_gpus_per_node", 1)) * int(config_value(cfg, "trainer.nnodes", 1))
    a_size, r_size = int(config_value(cfg, f"{a}.fsdp_size", -1)), int(config_value(cfg, f"{r}.fsdp_size", -1))
    a_group, r_group = (world if n < 0 or n >= world else n for n in (a_size, r_size))
    if a_group != r_group:
        _fail(f"rpg.reference.mode={mode} copies actor shards into the reference: {a}.fsdp_size={a_size} and "
              f"{r}.fsdp_size={r_size} shard over {a_group} and {r_group} of {world} ranks; set them equal")
    if engine_strategy != "fsdp":
        return
    for key, default in (("wrap_policy", None), ("use_orig_params", False)):
        a_val, r_val = (OmegaConf.select(cfg, f"{side}.{key}", default=default) for side in (a, r))
        a_val, r_val = (OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for v in (a_val, r_val))
        if a_val != r_val:
            _fail(f"rpg.reference.mode={mode} copies FSDP1 flat-parameter shards into the reference: "
                  f"{a}.{key}={a_val!r} and {r}.{key}={r_val!r} must be equal")


def check_probe_without_sequence_parallelism(cfg) -> None:
    """``rpg.reference.log_weight_diff`` runs one whole probe sequence through actor and reference on
    every rank (``rpg.verl.reference_copy.probe_logits``). Under Ulysses sequence parallelism verl
    patches attention to exchange sequence *slices* between the ranks of a group, so a whole sequence
    per rank would give wrong logits (or a shape error); reject it before Ray starts."""
    big = ulysses_sizes(cfg)
    if big:
        _fail(f"rpg.reference.log_weight_diff=true is not supported with Ulysses sequence parallelism ({big[0]}): "
              "its probe runs one unsplit sequence per rank; set rpg.reference.log_weight_diff=false")


FUSED_KERNELS = "actor_rollout_ref.model.use_fused_kernels"


def check_probe_without_fused_kernels(cfg) -> None:
    """``rpg.reference.log_weight_diff`` compares the logits of actor and reference on a probe sequence; with
    verl's fused kernels (``actor_rollout_ref.model.use_fused_kernels``, one model config for actor and reference)
    the patched forward returns log-probabilities and entropy, no logits: the first step's probe would fail after
    Ray and the model load (``rpg.verl.reference_copy.probe_logits``). Refused before Ray."""
    if config_value(cfg, FUSED_KERNELS, False):
        _fail(f"rpg.reference.log_weight_diff=true needs the models' logits, which {FUSED_KERNELS}=true does not "
              f"return (verl's fused forward gives log-probabilities); set {FUSED_KERNELS}=false or "
              "rpg.reference.log_weight_diff=false")


# ----------------------------------------------------------------------------- reward


VERL_REWARD_NAME = "compute_score"  # verl's default reward.custom_reward_function.name (its ppo_trainer.yaml)


def check_reward_name_has_path(cfg, spec: str | None) -> None:
    """``reward.custom_reward_function.name`` set without ``.path``: verl ignores a name without a path, and the
    recipe would replace it with ``rpg.reward_function``'s; the run would be scored by another function than
    the one asked for. Refused in one line (verl's default name and the recipe function's own name pass)."""
    name = config_value(cfg, "reward.custom_reward_function.name")
    if name is None or name == VERL_REWARD_NAME or (spec is not None and name == spec.split(":")[1]):
        return
    instead = (f"the recipe would otherwise score with {spec}, rpg.reward_function" if spec else
               "verl would otherwise score with its default_compute_score, rpg.reward_function=null")
    _fail(f"reward.custom_reward_function.name={name} without reward.custom_reward_function.path: set the path of "
          f"the file that defines {name} ({instead})")


def check_rpg_reward_kwargs(cfg) -> None:
    """When the reward function is ``rpg.reward.compute_score``: its options (reward_kwargs) are valid."""
    from omegaconf import OmegaConf

    import rpg.reward
    from rpg.reward.scored_sources import is_rpg_reward

    fn = cfg.reward.get("custom_reward_function") or {}
    if is_rpg_reward(fn.get("path"), fn.get("name")):
        kwargs = OmegaConf.to_container(fn.get("reward_kwargs") or OmegaConf.create({}), resolve=True)
        try:
            rpg.reward.check_reward_kwargs(kwargs, where="reward.custom_reward_function.reward_kwargs")
        except ValueError as e:
            raise RPGConfigError(str(e)) from None


# ----------------------------------------------------------------------------- trainer mode


TRAINER_MODES = ("sync", "colocate_async", "separate_async")  # trainer.v1.trainer_mode values the recipe runs
_GPU_ASYNC = ("needs two or more GPUs (a separate rollout pool) and a GPU weight-sync backend, not the CPU "
              "backend's naive one")
REFUSED_ASYNC = {
    "one_step_off_policy": f"is verl's older recipe (python -m verl.experimental.one_step_off_policy.main_ppo): it "
                           f"{_GPU_ASYNC} and rewrites the actor's loss_mode to bypass_mode, replacing the RPG loss",
    "fully_async_policy": f"is verl's older recipe (python -m verl.experimental.fully_async_policy.fully_async_main): "
                          f"it {_GPU_ASYNC} and rewrites the actor's loss_mode to bypass_mode, replacing the RPG loss "
                          "(verl points its users to separate_async)",
}
_DEFAULT_BEHAVIOR = RPGLossConfig()
# Why schedule-free AdamW is refused in each asynchronous mode: its evaluation switch (rpg.verl.trainer,
# RPGTrainerMixin._sf_switch) sleeps the replicas and pushes the averaged weights x through the trainer's
# checkpoint_manager, verl's hybrid one, forced to naive (verl/trainer/ppo/v1/trainer_base.py:380-387)
SCHEDULEFREE_ASYNC_WHY = {
    "colocate_async": "its validation switch sleeps the replicas and pushes the averaged weights while the "
                      "asynchronous rollout is still generating",
    "separate_async": "its validation switch pushes the averaged weights x to the hybrid replicas only (the trainer's "
                      "checkpoint manager, forced to naive: verl/trainer/ppo/v1/trainer_base.py:380-387), while the "
                      "standalone pool, synced by its own manager (trainer_separate_async.py:164-170), keeps the "
                      "training weights y: validation would mix x and y",
}


def check_trainer_mode(cfg, settings: RPGSettings) -> bool:
    """``trainer.v1.trainer_mode``: sync, or colocate_async / separate_async with everything that keeps the loss exact
    under a stale sampler mu (one line each otherwise). Returns True for a stale sampler."""
    mode = config_value(cfg, "trainer.v1.trainer_mode", "sync")
    if mode in REFUSED_ASYNC:
        _fail(f"trainer.v1.trainer_mode={mode} is not supported by the RPG recipe: it {REFUSED_ASYNC[mode]}; "
              f"allowed: {', '.join(TRAINER_MODES)}")
    if mode not in TRAINER_MODES:
        _fail(f"trainer.v1.trainer_mode={mode!r} is not supported by the RPG recipe; allowed: {', '.join(TRAINER_MODES)}")
    loss, rc = settings.loss, "algorithm.rollout_correction"
    if mode == "sync":
        for field in ("behavior_weight_level", "behavior_weight_cap"):
            if getattr(loss, field) != getattr(_DEFAULT_BEHAVIOR, field):
                _fail(f"rpg.loss.{field}={getattr(loss, field)!r} is only used with a stale sampler "
                      f"(trainer.v1.trainer_mode=colocate_async); leave it at {getattr(_DEFAULT_BEHAVIOR, field)!r}")
        return False
    # colocate_async, separate_async: every sample comes from mu, one or more updates behind pi_old
    if mode == "separate_async":
        check_separate_async(cfg, settings)
    why = "the samples come from a stale policy mu"
    if settings.optimizer == "schedulefree":
        _fail(f"rpg.optimizer=schedulefree is not supported with trainer.v1.trainer_mode={mode}: "
              f"{SCHEDULEFREE_ASYNC_WHY[mode]}; use rpg.optimizer=adamw")
    if not config_value(cfg, "actor_rollout_ref.rollout.calculate_log_probs", False):
        _fail(f"actor_rollout_ref.rollout.calculate_log_probs=False with trainer.v1.trainer_mode={mode}: {why} and "
              "its log-probs are needed for the exact weights pi_old/mu; set it to True")
    bypass = bool(config_value(cfg, f"{rc}.bypass_mode", False))
    rollout_is = config_value(cfg, f"{rc}.rollout_is", None)
    if settings.uses_rpg_actor_loss:
        if rollout_is is not None:
            _fail(f"{rc}.rollout_is={rollout_is!r} with rpg.loss.name={settings.loss_name}: the RPG loss applies "
                  "the exact weights pi_old/mu itself (verl's would apply them twice); set it to null "
                  "(truncation, biased: rpg.loss.behavior_weight_cap)")
        if config_value(cfg, f"{rc}.rollout_rs", None) is not None:
            _fail(f"{rc}.rollout_rs={config_value(cfg, f'{rc}.rollout_rs')!r} with rpg.loss.name={settings.loss_name} "
                  f"and trainer.v1.trainer_mode={mode}: rejecting tokens by their weight changes the distribution "
                  "the exact weights correct for; set it to null")
        return True
    # rpg.loss.name=verl: verl's own loss must see mu
    if config_value(cfg, "actor_rollout_ref.actor.use_kl_loss", False):
        _fail(f"actor_rollout_ref.actor.use_kl_loss=True with rpg.loss.name=verl and trainer.v1.trainer_mode={mode}: "
              f"{why} and verl's KL loss term ignores the importance weights; use rpg.loss.name=rpg or grpo_corrected "
              "(exact) or set use_kl_loss=False")
    if not bypass and rollout_is is None:
        _fail(f"rpg.loss.name=verl with trainer.v1.trainer_mode={mode} and {rc}.rollout_is=null: {why} and verl's "
              f"loss would ignore it; set {rc}.rollout_is=token|sequence or {rc}.bypass_mode=True, or use "
              "rpg.loss.name=rpg")
    return True


# verl's checkpoint engines the recipe composes for a standalone rollout pool on GPUs: nccl, the GPU launch's
# (verl/checkpoint_engine/nccl_checkpoint_engine.py:119); kimi, nixl, mooncake, delta_sharded are registered too but
# not composed by the recipe
GPU_ENGINES = (GPU_ENGINE,)
# trainer.v1.separate_async.parameter_sync_step: verl's default (verl/trainer/config/ppo_trainer.yaml)
SYNC_STEP_DEFAULT = 4


def check_separate_async(cfg, settings: RPGSettings) -> None:
    """``trainer.v1.trainer_mode=separate_async`` as the recipe runs it: the weight sync (the CPU backend's
    rpg.backends.cpu.weight_sync, or verl's nccl on GPUs; each backend's launch sets it), the standalone rollout pool
    (its sizes, split into whole replicas of TP x DP x PP GPUs), verl's batch rule, the hybrid replicas kept (the
    reference copies live in the fused worker) and not lent to generation, the rollout (HF on CPU, vLLM on GPUs).
    One line each, before Ray."""
    from rpg.backends import backend_of_run
    from rpg.backends.cpu.env_overrides import CHECKPOINT_ENGINE, CHECKPOINT_ENGINE_ROOT, ENGINE_MODULE, ENGINE_NAME

    mode = "trainer.v1.trainer_mode=separate_async"
    backend = backend_of_run(cfg)
    if backend not in ("cpu", "gpu"):
        _fail(f"trainer.device={config_value(cfg, 'trainer.device', None)} with {mode}: the recipe runs it on the CPU "
              "backend (trainer.device=cpu) and on GPUs (trainer.device=cuda) only")
    gpu = backend == "gpu"
    engine = config_value(cfg, CHECKPOINT_ENGINE, "naive")
    module = config_value(cfg, f"{CHECKPOINT_ENGINE_ROOT}.custom_backend_module", None)
    if gpu and engine not in GPU_ENGINES:
        _fail(f"{CHECKPOINT_ENGINE}={engine} with {mode} on GPUs: the recipe syncs the standalone rollout pool through "
              f"verl's {' or '.join(GPU_ENGINES)} checkpoint engine (the GPU launch sets it); allowed: "
              f"{', '.join(GPU_ENGINES)}")
    if not gpu and (engine != ENGINE_NAME or module != ENGINE_MODULE):
        _fail(f"{CHECKPOINT_ENGINE}={engine} with {CHECKPOINT_ENGINE_ROOT}.custom_backend_module={module}: {mode} on "
              f"the CPU backend syncs the standalone rollout pool through {ENGINE_NAME} from {ENGINE_MODULE}; set both "
              "(the CPU backend's launch does)")
    pool = {}
    for key in ("actor_rollout_ref.rollout.nnodes", "actor_rollout_ref.rollout.n_gpus_per_node"):
        value = pool[key] = config_value(cfg, key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            _fail(f"{key}={value!r} with {mode}: the standalone rollout pool needs an integer >= 1 ("
                  + ("its nodes and GPUs per node, beside the trainer's trainer.nnodes x trainer.n_gpus_per_node)"
                     if gpu else "one logical GPU per rollout rank)"))
    check_rollout_pool_split(cfg, *pool.values(), mode)
    k = config_value(cfg, "trainer.v1.separate_async.parameter_sync_step", SYNC_STEP_DEFAULT)
    batch, mini = config_value(cfg, "data.train_batch_size"), config_value(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size")
    hint = f"; set parameter_sync_step={batch // mini}" if mini and batch % mini == 0 else ""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        _fail(f"trainer.v1.separate_async.parameter_sync_step={k!r} with {mode}: the optimizer updates between two "
              f"weight syncs, an integer >= 1 (data.train_batch_size={batch} / actor_rollout_ref.actor."
              f"ppo_mini_batch_size={mini}){hint}")
    if batch != k * mini:
        _fail(f"data.train_batch_size={batch} with {mode}: it must equal trainer.v1.separate_async.parameter_sync_step"
              f"={k} x actor_rollout_ref.actor.ppo_mini_batch_size={mini} (one weight sync every {k} updates){hint}")
    world = int(config_value(cfg, "trainer.nnodes", 1)) * int(config_value(cfg, "trainer.n_gpus_per_node", 1))
    rows = mini * int(config_value(cfg, "actor_rollout_ref.rollout.n", 1)) // world
    for role in ("rollout", "ref"):
        key = f"actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu"
        size = config_value(cfg, key, None)
        if isinstance(size, int) and size > 0 and rows % size:
            _fail(f"{key}={size} with {mode}: its log-probs are computed per mini-batch, {rows} sequences per rank "
                  f"(ppo_mini_batch_size={mini} x rollout.n / {world} ranks); set a divisor of {rows}")
    # verl/trainer/ppo/v1/trainer_separate_async.py:71-76: the standalone rollout never pauses to free the GPUs
    if config_value(cfg, "reward.reward_model.enable", False) and not config_value(
            cfg, "reward.reward_model.enable_resource_pool", False):
        _fail(f"reward.reward_model.enable_resource_pool=False with {mode} and a reward model: verl does not colocate "
              "it in this mode (its standalone rollout never pauses to free the GPUs); set it to True")
    if not config_value(cfg, "actor_rollout_ref.hybrid_engine", True):
        _fail(f"actor_rollout_ref.hybrid_engine=False with {mode} is not supported by the recipe (not run; the "
              "reference copies of rpg.reference.mode periodic|kl_threshold need the fused worker); leave it True")
    if config_value(cfg, "trainer.v1.separate_async.hybrid_rollout.enable_switch", False):
        _fail(f"trainer.v1.separate_async.hybrid_rollout.enable_switch=True with {mode} is not supported by the "
              "recipe (not run); set it to False")
    name = config_value(cfg, "actor_rollout_ref.rollout.name", "hf")
    if gpu and name != "vllm":
        _fail(f"actor_rollout_ref.rollout.name={name} with {mode} on GPUs is not supported by the recipe (its "
              "standalone replicas and the nccl sync are composed for vLLM only); allowed: vllm")
    if not gpu and name != "hf":
        _fail(f"actor_rollout_ref.rollout.name={name} with {mode} on the CPU backend is not supported by the recipe: "
              f"{VLLM_CPU_STANDALONE}; allowed: hf")


# verl 0.9.1's standalone vLLM path on a CPU, read but never run in the vLLM-CPU environment (paths in the verl
# package): no CUDA IPC, so the sync goes through shared-memory buckets (vllm_rollout/vllm_rollout.py:143) over a
# local socket to the replica's own processes (:139-141), each bucket holding the largest tensor
# (bucketed_weight_transfer.py:140-144); release_kv_cache's sleep (vllm_async_server.py:875-883) reaches vLLM's CPU
# worker, which ignores it (rpg.backends.cpu.vllm_cpu). No line of it needs a GPU; it has simply not run.
VLLM_CPU_STANDALONE = ("its standalone vLLM replicas were never run in the vLLM-CPU environment (verl 0.9.1 would "
                       "send them the weights through shared-memory buckets, verl/workers/rollout/vllm_rollout/"
                       "vllm_rollout.py:143, each holding the largest tensor, bucketed_weight_transfer.py:140-144)")


def check_rollout_pool_split(cfg, nnodes: int, gpus_per_node: int, mode: str) -> None:
    """verl's standalone pool: ``nnodes x n_gpus_per_node`` GPUs (the CPU backend's logical ones) in replicas of
    TP x DP x PP GPUs each (verl/workers/rollout/llm_server.py:434-460 floors the count of replicas, so a remainder
    would sit idle, and a pool smaller than one replica has none), each replica's placement group on whole nodes
    or within one (verl/workers/rollout/replica.py:113-117, 198-201)."""
    r = "actor_rollout_ref.rollout"
    sizes = {key: config_value(cfg, f"{r}.{key}", 1) for key in
             ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")}
    replica = 1
    for size in sizes.values():
        replica *= int(size)
    total = nnodes * gpus_per_node
    split = " x ".join(f"{key}={value}" for key, value in sizes.items())
    if total % replica:
        _fail(f"{r}.nnodes={nnodes} x {r}.n_gpus_per_node={gpus_per_node} = {total} GPUs with {mode}: the standalone "
              f"rollout pool is split into replicas of {split} = {replica} GPUs; set a multiple of {replica}")
    if replica % gpus_per_node and gpus_per_node % replica:
        _fail(f"{r}.n_gpus_per_node={gpus_per_node} with {mode}: a replica of {replica} GPUs ({split}) fills whole "
              f"nodes or shares one; set n_gpus_per_node to a divisor or a multiple of {replica}")
