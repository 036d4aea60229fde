"""What the launch prints about a run before or instead of starting it.

* ``header``: the run's description (its experiment file's first comment lines) and the settings it uses, read
  from its composed config, with ``notes`` (a rename for the overrides, a file other than the generated one);
* ``describe``: ``--describe [--full] [--gpu-mem-gib G] [--host-mem-gib H]``: the header, the file's settings,
  optionally the whole resolved config, then the memory plan (``rpg.memory``, docs/memory.md);
* ``dry_run``: ``DRY_RUN=1``: the composed and checked config and the command; what this node lacks and missing
  input paths as warnings, every other refusal of the driver its one line (exit 2).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from rpg.backends.registry import backend
from rpg.override_lists import override_key, values
from rpg.config import RPGConfigError
from rpg.launch.environment import LaunchError, Request
from rpg.launch.experiments import Experiment, changed_name, file_note, name_changes
from rpg.verl.input_paths import NAME_MAX, InputPathError, input_path_problems, refusals

REWARD_PATH = "reward.custom_reward_function.path"
MEMORY_FLAGS = {"--gpu-mem-gib": "the GPU's memory in GiB (e.g. --gpu-mem-gib 80)",
                "--host-mem-gib": "the node's RAM in GiB (e.g. --host-mem-gib 1024)"}


def header(exp: Experiment | None, cfg, notes: Sequence[str] = ()) -> str:
    """The header of a launch: the run's description, then the settings it uses, read from its composed config
    ``cfg`` (the experiment file's and the overrides': what the driver is given), then ``notes``, a line each."""
    from omegaconf import OmegaConf

    def get(key: str):
        return OmegaConf.select(cfg, key, default=None)

    a = "actor_rollout_ref.actor"
    loss = get("rpg.loss.name")
    if loss == "verl":  # verl's KL loss, against pi_old when the driver moved it to the sampler (rpg_sampler_kl)
        kl = bool(get(f"{a}.use_kl_loss") or get(f"{a}.policy_loss.rpg_sampler_kl"))
        form, clip, divergence = "ppo", True, None
        beta, kl_type = (get(f"{a}.kl_loss_coef"), get(f"{a}.kl_loss_type")) if kl else (0.0, None)
    else:
        form, clip, beta, kl_type = get("rpg.loss.form"), get("rpg.loss.clip"), get("rpg.loss.beta"), None
        kl = beta != 0
        divergence = get("rpg.loss.divergence") if kl else None
    name, run = get("trainer.experiment_name"), exp.name if exp is not None else None
    row = exp.row if exp is not None else ""
    low, high = _g(get(f"{a}.clip_ratio_low")), _g(get(f"{a}.clip_ratio_high"))
    eps = f"({low}, {high})" + ("" if clip else " unused: unclipped")
    said = f": {row}" if row else ""
    first = f"run {name}{said}" if run in (None, name) else f"run {name} (from {run}{said})"
    lines = [
        first,
        f"  model {get('actor_rollout_ref.model.path')} (prompt {get('data.max_prompt_length')} + response "
        f"{get('data.max_response_length')})",
        f"  loss {loss}:{form} divergence={divergence} beta={_g(beta)} kl_type={kl_type} clip={clip} eps={eps} "
        f"c={_g(get(f'{a}.clip_ratio_c'))}",
        f"  adv={get('algorithm.adv_estimator')} lr={_g(get(f'{a}.optim.lr'))} optimizer={get('rpg.optimizer')} "
        f"reference={get('rpg.reference.mode') if kl else 'none'} filtering={get('algorithm.filter_groups.enable')} "
        f"overlong={get('reward.reward_kwargs.overlong_buffer_cfg.enable')} "
        f"(buffer {get('reward.reward_kwargs.overlong_buffer_cfg.len')})",
    ]
    lines += [f"  {line}" for line in (exp.description[1:] if exp is not None else ()) if line]
    return "\n".join(lines + [f"  note: {note}" for note in notes])


def _g(x) -> str:
    """A number as ``%g`` writes it, anything else as it is (the header is printed before every value is checked)."""
    return f"{x:g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def launch_notes(exp: Experiment | None, req: Request, user: Sequence[str]) -> list[str]:
    """The header's notes: the user's overrides change what the run's file says (``naming_note``), the run
    composes a file of the user's (``rpg.launch.experiments.file_note``)."""
    if exp is None:
        return []
    return [note for note in (naming_note(exp, req, user), file_note(exp)) if note]


def naming_note(exp: Experiment, req: Request, user: Sequence[str]) -> str | None:
    """One line when the user's overrides change a setting the run's file states: the name the run gets for it,
    or the name the user gave it, kept."""
    from rpg.launch.plan import experiment_name

    changes = name_changes(exp, user)
    if not changes:
        return None
    said = (f"{', '.join(f'{k}={text}' for k, text in changes)} change{'s' * (len(changes) == 1)} what the run "
            f"{exp.name} says")
    given = values(list(user)).get("trainer.experiment_name")
    if (mine := req.env.get("EXP_NAME", "").strip()) or given is not None:
        kept = f"EXP_NAME={mine}" if mine else f"trainer.experiment_name={given}"
        return f"{said}; the run keeps the name you gave it ({kept})"
    name, full = experiment_name(exp, req, user), changed_name(exp, changes)
    short = "" if name == full else (f", shortened with a digest of {full} (its log file's name would pass the file "
                                     f"system's {NAME_MAX} bytes)")
    return (f"{said}: the run is named {name} (trainer.experiment_name: its checkpoint folder, logs and report labels"
            f"{short}; EXP_NAME=... names it otherwise)")


def memory_report(cfg, sizes: tuple[float, float], *, unavailable_ok: bool = False) -> str:
    """The memory plan of a composed config (``rpg.memory.report``); sizes = (GPU, node RAM) in GiB. An estimate
    that cannot be made (unknown model, ...) is ``LaunchError``, or with ``unavailable_ok`` a note."""
    from omegaconf import OmegaConf

    from rpg.memory import MemoryEstimateError, report

    try:
        return report(OmegaConf.to_container(cfg, resolve=True), *sizes)
    except MemoryEstimateError as e:
        if unavailable_ok:
            return f"memory estimate unavailable: {e}"
        raise LaunchError(str(e)) from None


def memory_sizes(env: Mapping[str, str], flags: Mapping[str, str] | None = None) -> tuple[float, float]:
    """(GPU, node RAM) of the estimate in GiB: ``--gpu-mem-gib`` / ``--host-mem-gib``, else ``RPG_GPU_MEM_GIB`` /
    ``RPG_HOST_MEM_GIB``, else the defaults."""
    from rpg.memory import GPU_MEM_ENV, HOST_MEM_ENV, MemoryEstimateError, gpu_mem_gib, host_mem_gib

    flags = flags or {}
    try:
        gpu = (gpu_mem_gib(flags["--gpu-mem-gib"], "--gpu-mem-gib") if "--gpu-mem-gib" in flags
               else gpu_mem_gib(env.get(GPU_MEM_ENV), GPU_MEM_ENV))
        host = (host_mem_gib(flags["--host-mem-gib"], "--host-mem-gib") if "--host-mem-gib" in flags
                else host_mem_gib(env.get(HOST_MEM_ENV), HOST_MEM_ENV))
    except MemoryEstimateError as e:
        raise LaunchError(str(e)) from None
    return gpu, host


def split_flags(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """``--describe``, ``--full`` and the memory flags (``--gpu-mem-gib G`` or ``--gpu-mem-gib=G``) apart from the
    rest of the command line."""
    flags, rest = {}, []
    it = iter(argv)
    for a in it:
        flag, eq, value = a.partition("=")
        if a in ("--describe", "--full"):
            flags[a] = ""
        elif flag in MEMORY_FLAGS:
            value = value if eq else next(it, None)
            if value is None:
                raise LaunchError(f"{flag} needs a value, {MEMORY_FLAGS[flag]}")
            flags[flag] = value
        else:
            rest.append(a)
    if flags and "--describe" not in flags:
        raise LaunchError(f"{', '.join(flags)} {'go' if len(flags) > 1 else 'goes'} with --describe (the run's "
                          "memory plan)")
    return flags, rest


def describe(exp: Experiment, req: Request, overrides: Sequence[str], flags: Mapping[str, str]) -> int:
    """``--describe``: the header, the experiment file's settings, with ``--full`` the whole resolved config, then
    the memory plan of the config the launch composes (the environment and the overrides included), on the GPU
    backend whatever ``RPG_BACKEND`` says: the plan is of the paper's GPUs."""
    import contextlib
    import io

    from rpg.launch.plan import compose

    sizes = memory_sizes(req.env, flags)
    with contextlib.redirect_stdout(io.StringIO()):  # the driver checks' own report
        cfg, _ = compose(overrides)
    print(header(exp, cfg), flush=True)
    if exp.path is not None:
        shown = exp.path.relative_to(req.run_root) if exp.path.is_relative_to(req.run_root) else exp.path
        print(f"  settings of {shown} (on recipe/rpg/config/paper/default.yaml):\n    "
              + "\n    ".join(f"{k}={v}" for k, v in exp.settings.items()), flush=True)
    if "--full" in flags:
        from omegaconf import OmegaConf

        print("# ---- the full resolved config (as the driver hands it to verl) ----")
        print(OmegaConf.to_yaml(cfg, resolve=True), end="")
    print(memory_report(cfg, sizes))
    return 0


def _show_cluster_reward_path(cfg, root: Path) -> None:
    """The recipe's default reward file is found by import where the driver runs, i.e. under ``RPG_CLUSTER_ROOT``
    on the cluster: show that path rather than this checkout's."""
    from omegaconf import OmegaConf

    from rpg.paths.checkout import CHECKOUT

    path = OmegaConf.select(cfg, REWARD_PATH)
    if root != CHECKOUT and isinstance(path, str) and Path(path).is_relative_to(CHECKOUT):
        OmegaConf.update(cfg, REWARD_PATH, str(root / Path(path).relative_to(CHECKOUT)))


def dry_run(req: Request, exp: Experiment | None, overrides: Sequence[str], cmd: Sequence[str], composed=None,
            user: Sequence[str] = ()) -> int:
    """``DRY_RUN=1``: the header, the command, the composed and checked config; missing input paths and what this
    node lacks for the run (the backend's ``node_problems``) as warnings; then, for a run on the GPU backend, the
    memory plan. Every other problem of the input paths (``rpg.verl.input_paths.refusals``) is the driver's line
    (``InputPathError``, exit 2; a warning for a Ray job, which the driver on the cluster checks), and so are the
    backend's ``config_problems``. ``composed``: ``compose(overrides)``'s result when the caller has it."""
    from omegaconf import OmegaConf

    from rpg.launch.plan import compose

    chosen = backend(req.backend)
    sizes = None if chosen.TINY_TASK else memory_sizes(req.env)
    cfg, settings = composed or compose(overrides)
    print(f"# {header(exp, cfg, launch_notes(exp, req, user))}".replace("\n", "\n# "))
    if not any(override_key(o) == REWARD_PATH for o in overrides):
        _show_cluster_reward_path(cfg, req.run_root)
    print("# command: " + " ".join(cmd[:2]) + " \\\n#   " + " \\\n#   ".join(cmd[2:]))
    paths = input_path_problems(cfg)
    if not req.cluster and (refused := refusals(paths)):
        raise InputPathError(refused)
    driver_env = {**req.env, **chosen.run_env((), base=req.env)}  # as the driver sees it (VERL_PLATFORM=cpu, ...)
    if refused := chosen.config_problems(cfg, settings, driver_env):  # the driver's lines wherever it runs
        error = RPGConfigError("; ".join(refused))
        error.lines = refused
        raise error
    errors, warnings = chosen.node_problems(cfg, settings, driver_env)
    for problem in [*paths, *errors, *warnings]:
        print(f"rpg.launch: warning: {problem}", file=sys.stderr, flush=True)
    print("# ---- composed and validated config (DRY_RUN=1: nothing was started) ----")
    print(OmegaConf.to_yaml(cfg, resolve=True), end="")
    if sizes is not None:  # last, where a terminal shows it; '# ' keeps the output valid YAML
        print("# ---- " + memory_report(cfg, sizes, unavailable_ok=True).replace("\n", "\n# "))
    return 0
