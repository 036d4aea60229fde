"""A paper run rehearsed on this machine (``RPG_BACKEND=cpu``): the CPU backend, with a small model and task in
place of the run's model, data and sizes, and the run's algorithm settings kept, trained through the harness
(``rpg.trainer_process``; output in ``OUT_DIR``).

``RPG_CPU_MODEL=tiny`` (default): the tiny model and task (``rpg.tiny``); ``RPG_CPU_MODEL=smol``:
SmolLM2-135M-Instruct and its arithmetic task (``rpg.smol``, docs/smol.md), so the run's settings meet a real
tokenizer, chat template and response lengths. World size 1 unless ``NNODES`` / ``N_GPUS_PER_NODE`` (or their
keys) ask for more gloo ranks on this machine.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from rpg.backends.registry import backend
from rpg.paths.checkout import CHECKOUT, RECIPE_ENTRY
from rpg.override_lists import hydra_value, override_key, resume_command, values
from rpg.launch.environment import RESUMED_VARS, LaunchError, Request

STEPS = 2  # a rehearsal's training steps (the user's trainer.total_training_steps wins)


class CpuModel:
    """A model and task a CPU run trains, and the GPU smoke run (``rpg_lab.demo.gpu_smoke --model``), as its package
    declares it (``rpg.tiny.cpu_model``, ``rpg.smol.cpu_model``): its defaults, where its assets are before they are
    built, how they are built, its task's overrides (no algorithm settings), its torch threads per process."""

    def __init__(self, name: str):
        from rpg.smol import cpu_model as smol
        from rpg.tiny import cpu_model as tiny

        self.name, self.prefix = name, f"[{name}]"
        self.declared = {"tiny": tiny, "smol": smol}[name]  # rpg.launch.environment.CPU_MODELS
        d = self.declared
        self.steps, self.test_freq, self.lr, self.task, self.timeout_s = d.STEPS, d.TEST_FREQ, d.LR, d.TASK, d.TIMEOUT_S
        self.check_world_size, self.planned, self.task_overrides = d.check_world_size, d.planned, d.task_overrides
        self.folder = d.folder  # the assets' folder to show

    def build(self, prefix: str | None = None, model: bool = True):
        """The assets, built once, the progress lines led by ``prefix`` (default the model's); ``model=False``:
        SmolLM2's task files alone (a run given the model elsewhere). ``rpg.smol.SmolAssetError`` when SmolLM2
        cannot be built."""
        return self.declared.build(prefix or self.prefix, model=model)

    def run_env(self, overrides: Sequence[str], base: dict | None = None) -> dict[str, str]:
        """Environment variables of a run with ``overrides``: ``OMP_NUM_THREADS`` where the model declares its
        threads (SmolLM2 on the HF rollout: ``rpg.smol.overrides.omp_threads`` from this process's cores, its
        trainer mode and world size), unless ``base`` (default ``os.environ``) sets it (the CPU backend forwards the
        user's value); none for the tiny model (the backend's one thread per process) nor for verl's vLLM rollout
        (``RPG_CPU_ROLLOUT=vllm`` in ``base``: its CPU settings are measured with one thread,
        ``rpg.backends.cpu.vllm_cpu``)."""
        from rpg.backends.cpu import vllm_cpu

        base = os.environ if base is None else base
        if "OMP_NUM_THREADS" in base or vllm_cpu.rollout_of(base) == "vllm":
            return {}
        threads = self.declared.threads(values(list(overrides)), len(os.sched_getaffinity(0)))
        return {} if threads is None else {"OMP_NUM_THREADS": str(threads)}


def _world(req: Request, model: CpuModel) -> list[str]:
    """The world size: 1 x 1 unless the environment sets ``NNODES`` / ``N_GPUS_PER_NODE`` (the GPU default of 8
    ranks per node is not the CPU backend's); an elastic ``NNODES=MIN:MAX`` is planned at its largest count whose
    world the task splits. The user's ``trainer.nnodes`` / ``trainer.n_gpus_per_node`` win over both."""
    nnodes = req.nnodes
    if req.elastic:
        gpus = req.n_gpus_per_node or 1
        for k in range(req.node_count.high, req.node_count.low - 1, -1):
            try:
                model.check_world_size(k * gpus)
            except ValueError:
                continue
            nnodes = k
            break
    ov = [f"trainer.nnodes={nnodes}"] if nnodes else []
    return ov + ([f"trainer.n_gpus_per_node={req.n_gpus_per_node}"] if req.n_gpus_per_node else [])


def task_groups(groups: list[list[str]], req: Request, user: Sequence[str]) -> list[list[str]]:
    """``groups`` (the experiment's, the environment's overrides) without the keys the backend sets, then the
    rehearsal's model, task and world size, and the checkpoints under the run's output folder unless
    ``CKPTS_DIR`` is set (a cluster job keeps the environment's folder)."""
    from rpg.trainer_process.run_dir import default_checkpoint_dir
    from rpg.config import world_size_of

    model, owned = CpuModel(req.cpu_model), backend(req.backend).owned_keys()
    world = _world(req, model)
    try:
        nnodes, gpus = world_size_of(values([*world, *user]))
        model.check_world_size(nnodes * gpus)
    except ValueError as e:
        raise LaunchError(f"RPG_BACKEND={req.backend}: {e}") from None
    groups = [[o for o in g if override_key(o) not in owned] for g in groups]
    mode = values([*groups[0], *groups[1], *user]).get("trainer.v1.trainer_mode")
    extra = {"test_freq": STEPS} if model.declared.VALIDATES_ONLY_AT_THE_ENDS else {}
    groups += [model.task_overrides(model.planned(), steps=STEPS, world_size=nnodes * gpus, trainer_mode=mode,
                                    **extra), world]
    if not req.env.get("CKPTS_DIR", "").strip() and not req.cluster:
        names = values(groups[1])  # relative: the harness runs the trainer in its output folder
        ckpts = default_checkpoint_dir(names["trainer.project_name"], names["trainer.experiment_name"])
        groups.append([f"trainer.default_local_dir={hydra_value(ckpts, 'CKPTS_DIR')}"])
    return groups


def check_out_dir(req: Request, cfg) -> None:
    """A fresh start never overwrites the run a named ``OUT_DIR`` holds (``rpg.trainer_process.run_dir``)."""
    from rpg.trainer_process.run_dir import check_fresh_start, checkpoint_root

    if req.out_dir is not None:
        check_fresh_start(req.out_dir, cfg.trainer.resume_mode,
                          checkpoint_root(req.out_dir, str(cfg.trainer.default_local_dir)),
                          another="OUT_DIR=...; unset, a new folder per run")


def build(req: Request) -> None:
    """The rehearsal's model and task, built once (the input paths are then checked as the run finds them)."""
    from rpg.smol import SmolAssetError

    try:
        CpuModel(req.cpu_model).build()
    except SmolAssetError as e:
        raise LaunchError(str(e)) from None


def rehearse(req: Request, name: str, overrides: Sequence[str], user: Sequence[str], header: str, cfg,
             resume: str) -> int:
    """The rehearsal, run here; exit code: 0, the trainer's own (2: a config the driver refuses), 128 + signum when
    a stop signal ended it (one line: log, last complete checkpoint, resume command), else 1. ``cfg``: the run's
    composed config; ``resume``: how the run is launched again (its script)."""
    from rpg.trainer_process import TrainerRunError, report_failure, resume_decision, run_trainer
    from rpg.trainer_process.run_dir import new_run_dir

    prefix = f"[{req.backend}]"
    check_out_dir(req, cfg)
    build(req)
    out = req.out_dir or new_run_dir(CHECKOUT / "outputs" / req.backend / name)
    print(f"{header}\n{prefix} backend={req.backend}, {CpuModel(req.cpu_model).task}; output {out}", flush=True)

    def on_line(line: str) -> None:  # the driver's resume decision, on the terminal (CPU_ECHO=1 shows everything)
        if not req.echo and (decision := resume_decision(line)) is not None:
            print(f"{prefix} {decision}", flush=True)

    try:
        run = run_trainer(overrides, output_dir=out, entry=str(CHECKOUT / RECIPE_ENTRY), timeout_s=req.timeout_s,
                          echo=req.echo, on_line=on_line, backend=req.backend,
                          env=CpuModel(req.cpu_model).run_env(overrides, req.env))
    except TrainerRunError as e:
        # the variables the user set (RPG_BACKEND=cpu among them), the run's folder, the same overrides
        again = resume_command(resume, user, str(req.cwd), {**req.env, "OUT_DIR": str(out)}, RESUMED_VARS)
        return report_failure(e, prefix, f"resume: {again}")
    for note in run.notes:
        print(f"{prefix} note: {note}", flush=True)
    print(f"{prefix} done: {run.last_step()} steps in {run.wall_time_s:.0f}s; metrics {run.metrics_file}; "
          f"log {run.log_file}", flush=True)
    return 0


def import_platform(req: Request) -> None:
    """verl chooses its platform when it is first imported in this process (the logger check, the first
    composition): the backend's platform variables come first."""
    chosen = backend(req.backend)
    try:
        import_env = chosen.run_env((), base=req.env)
    except ValueError as e:  # a backend variable's bad value (RPG_CPU_ROLLOUT, RPG_CPU_PREFIX_TREE): one line
        raise LaunchError(str(e)) from None
    os.environ.update({k: import_env[k] for k in chosen.IMPORT_ENV if k in import_env})

