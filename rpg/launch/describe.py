"""What the launcher prints about a run before or instead of starting it.

* ``describe_variant``: the run name's paper row and the settings the run uses (model, loss, schedule: its
  composed config), printed before every launch, with ``launch_notes`` (``naming_note``: the name a run gets when
  the user's overrides change what its name says); ``list_table``: the shipped scripts (``--list``;
  docs/launch-scripts.md is written from it).
* ``describe``: ``--describe NAME [--full] [--gpu-mem-gib G] [--host-mem-gib H] [overrides]``: the variant, the
  overrides its name sets, optionally the whole resolved config, then the memory and disk estimate.
* ``dry_run``: ``DRY_RUN=1``: the composed and validated config and the command, with what this node lacks
  for the run (the backend's ``node_problems``) and missing input paths as warnings, then the estimate; an
  input the driver would refuse wherever it runs (a data file in the wrong layout, ...) is its refusal, exit 2.
* ``memory_report`` / ``memory_sizes``: ``rpg.launch.memory``'s per-GPU memory table, the host RAM per node
  and the checkpoint disk of a composed config (docs/memory.md).
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from rpg.backends.registry import backend
from rpg.common.override_lists import override_key, values
from rpg.config import RPGConfigError
from rpg.launch.experiments import EXPERIMENT_DIR, GROUP, file_note
from rpg.launch.plan import CONFIG_DIR, CONFIG_NAME, compose, experiment_name, plan
from rpg.launch.request import LaunchError, LaunchRequest, project_root
from rpg.launch.name_changes import name_changes
from rpg.launch.variants import Variant, known_names, paper_refs, paper_row, parse, to_overrides
from rpg.verl.input_paths import InputPathError, input_path_problems, refusals

REWARD_PATH = "reward.custom_reward_function.path"


def describe_variant(v: Variant, cfg, notes: Sequence[str] = ()) -> str:
    """The header of a launch: the run name's paper row, then the settings the run uses, read from its composed
    config ``cfg`` (the name's, or its experiment file's, and the overrides': what the driver is given), then
    ``notes`` (``launch_notes``), a line each."""
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
    row = f"{paper_row(v)} [{', '.join(paper_refs(v)) or 'not in the paper'}]"
    name = get("trainer.experiment_name")
    low, high = _g(get(f"{a}.clip_ratio_low")), _g(get(f"{a}.clip_ratio_high"))
    eps = f"({low}, {high})" + ("" if clip else " unused: unclipped")
    lines = [
        f"run {v.name}: {row}" if name == v.name else f"run {name} (from {v.name}: {row})",
        f"  model {get('actor_rollout_ref.model.path')} (prompt {get('data.max_prompt_length')} + response "
        f"{get('data.max_response_length')})",
        f"  loss {loss}:{form} divergence={divergence} beta={_g(beta)} kl_type={kl_type} clip={clip} eps={eps} "
        f"c={_g(get(f'{a}.clip_ratio_c'))}",
        f"  adv={get('algorithm.adv_estimator')} lr={_g(get(f'{a}.optim.lr'))} optimizer={get('rpg.optimizer')} "
        f"reference={get('rpg.reference.mode') if kl else 'none'} filtering={get('algorithm.filter_groups.enable')} "
        f"overlong={get('reward.reward_kwargs.overlong_buffer_cfg.enable')} "
        f"(buffer {get('reward.reward_kwargs.overlong_buffer_cfg.len')})",
    ]
    if v.irregular:
        lines.append(f"  irregular name: {v.irregular}")
    return "\n".join(lines + [f"  note: {note}" for note in notes])


def _g(x) -> str:
    """A number as ``%g`` writes it, anything else as it is (the header is printed before every value is checked)."""
    return f"{x:g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def launch_notes(v: Variant, req: LaunchRequest, user: Sequence[str]) -> list[str]:
    """The header's notes: the user's overrides change what the run name says (``naming_note``), the run composes an
    experiment file that is not the grammar's (``rpg.launch.experiments.file_note``)."""
    return [note for note in (naming_note(v, req, user), file_note(v, user)) if note]


def naming_note(v: Variant, req: LaunchRequest, user: Sequence[str]) -> str | None:
    """One line when the user's overrides change a setting the run name says (``name_changes``): the name the run
    gets for it (``rpg.launch.plan.experiment_name``), or the name the user gave it, kept."""
    changes = name_changes(v, list(user))
    if not changes:
        return None
    said = f"{', '.join(f'{k}={text}' for k, text in changes)} change{'s' * (len(changes) == 1)} what the run name " \
           f"{v.name} says"
    given = values(user).get("trainer.experiment_name")
    if req.experiment or given is not None:
        mine = f"EXP_NAME={req.experiment}" if req.experiment else f"trainer.experiment_name={given}"
        return f"{said}; the run keeps the name you gave it ({mine})"
    return (f"{said}: the run is named {experiment_name(v, req, user)} (trainer.experiment_name: its checkpoint "
            "folder, logs and report labels; EXP_NAME=... names it otherwise)")


def list_table() -> str:
    """Markdown table of the shipped scripts (docs/launch-scripts.md is written from it)."""
    rows = ["| script | paper row | reported in | divergence / form | clip (eps) | beta | lr | optimizer | model | reference |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name in known_names():
        v = parse(name)
        form = v.form if v.divergence is None else f"{v.divergence} / {v.form}"
        clip = f"{v.eps_low:g}/{v.eps_high:g}" if v.clip else "none"
        rows.append(f"| `{name}` | {paper_row(v)} | {', '.join(paper_refs(v)) or '-'} | {form} | {clip} | {v.beta:g} | "
                    f"{v.lr:g} | {v.optimizer} | {v.model.split('/')[-1]} | {v.reference} |")
    return "\n".join(rows)


def memory_report(cfg, sizes: tuple[float, float], *, unavailable_ok: bool = False) -> str:
    """rpg.launch.memory's per-GPU memory table, host RAM per node and checkpoint-disk lines for a composed
    config; sizes = (GPU, node RAM) in GiB.

    An estimate that cannot be made (unknown model, ...) raises ``LaunchError`` (one line), or with
    ``unavailable_ok`` (DRY_RUN: the config itself is valid) returns that line as a note.
    """
    from omegaconf import OmegaConf

    from rpg.launch.memory import MemoryEstimateError
    from rpg.launch.memory import report

    try:
        return report(OmegaConf.to_container(cfg, resolve=True), *sizes)
    except MemoryEstimateError as e:
        if unavailable_ok:
            return f"memory estimate unavailable: {e}"
        raise LaunchError(str(e)) from None


def memory_sizes(env: Mapping[str, str], gpu_cli: str | None = None, host_cli: str | None = None) -> tuple[float, float]:
    """(GPU, node RAM) of the estimate in GiB: ``--gpu-mem-gib`` / ``--host-mem-gib`` if given, else
    ``RPG_GPU_MEM_GIB`` / ``RPG_HOST_MEM_GIB``, else the defaults."""
    from rpg.launch.memory import GPU_MEM_ENV, MemoryEstimateError, gpu_mem_gib
    from rpg.launch.memory import HOST_MEM_ENV, host_mem_gib

    try:
        gpu = gpu_mem_gib(gpu_cli, "--gpu-mem-gib") if gpu_cli is not None else gpu_mem_gib(env.get(GPU_MEM_ENV), GPU_MEM_ENV)
        host = (host_mem_gib(host_cli, "--host-mem-gib") if host_cli is not None
                else host_mem_gib(env.get(HOST_MEM_ENV), HOST_MEM_ENV))
    except MemoryEstimateError as e:
        raise LaunchError(str(e)) from None
    return gpu, host


def describe(args: list[str], env: Mapping[str, str]) -> int:
    """``--describe NAME [--full] [--gpu-mem-gib G] [--host-mem-gib H] [overrides]``: the variant, the
    overrides its name sets (the rest is the recipe YAML and the paper setup), with ``--full`` the whole
    resolved config, then the memory and disk estimate of the config the launcher would compose
    (environment and overrides included)."""
    cli: dict[str, str | None] = {"--gpu-mem-gib": None, "--host-mem-gib": None}
    examples = {"--gpu-mem-gib": "the GPU's memory in GiB (e.g. --gpu-mem-gib 80)",
                "--host-mem-gib": "the node's RAM in GiB (e.g. --host-mem-gib 1024)"}
    rest, full = [], False
    it = iter(args)
    for a in it:
        flag = a.split("=", 1)[0]
        if a == "--full":
            full = True
        elif flag in cli:
            cli[flag] = a.split("=", 1)[1] if "=" in a else next(it, None)
            if cli[flag] is None:
                raise LaunchError(f"{flag} needs a value, {examples[flag]}")
        else:
            rest.append(a)
    if not rest or rest[0].startswith("-"):
        raise LaunchError("--describe takes one run name (then optionally --full, --gpu-mem-gib G, --host-mem-gib H "
                          "and Hydra overrides)")
    sizes = memory_sizes(env, cli["--gpu-mem-gib"], cli["--host-mem-gib"])
    v = parse(rest[0])
    # the variant's own run on the default backend, whatever RPG_BACKEND says: the estimate is of the paper's GPUs
    req = LaunchRequest.read({k: v for k, v in env.items() if k != "RPG_BACKEND"}, project_root(), Path.cwd())
    overrides, _ = plan(req, v, rest[1:])
    with contextlib.redirect_stdout(io.StringIO()):  # the driver checks' own report
        cfg, _ = compose(overrides, req.root)
    print(describe_variant(v, cfg), flush=True)
    print(f"  overrides of the name (on {CONFIG_DIR / CONFIG_NAME}.yaml + {CONFIG_DIR / 'paper' / 'default.yaml'}):\n    "
          + " ".join(to_overrides(v)), flush=True)
    if v.name in known_names():
        print(f"  every setting of the name: {EXPERIMENT_DIR / v.name}.yaml (+{GROUP}={v.name})", flush=True)
    if full:
        from omegaconf import OmegaConf

        print("# ---- the full resolved config (as the driver hands it to verl) ----")
        print(OmegaConf.to_yaml(cfg, resolve=True), end="")
    print(memory_report(cfg, sizes))
    return 0


def _show_cluster_reward_path(cfg, root: Path, run_root: Path) -> None:
    """The recipe's default reward file is found by import where the driver runs, i.e. under
    ``RPG_CLUSTER_ROOT`` on the cluster: show that path rather than this checkout's."""
    from omegaconf import OmegaConf

    path = OmegaConf.select(cfg, REWARD_PATH)
    if run_root != root and isinstance(path, str) and Path(path).is_relative_to(root):
        OmegaConf.update(cfg, REWARD_PATH, str(run_root / Path(path).relative_to(root)))


def dry_run(req: LaunchRequest, v: Variant, overrides: Sequence[str], cmd: Sequence[str], composed=None,
            user: Sequence[str] = ()) -> int:
    """``DRY_RUN=1``: the header (with the notes on the user's overrides ``user``), the command, the composed and
    validated config; missing input paths and what this node lacks for the run (the backend's ``node_problems``) as
    warnings; then, for a run of the variant itself (not the tiny task), the memory estimate (sizes:
    ``memory_sizes``). ``composed``: ``compose(overrides)``'s result when the caller has it. The other problems of
    the input paths (``rpg.verl.input_paths.refusals``: an existing data file in the wrong layout or with a
    ``data_source`` no reward function scores, an empty list, ...) raise ``InputPathError``, the driver's lines
    (exit 2; for a Ray submission they are warnings, as the launch leaves them to the driver on the cluster), and
    so do the backend's ``config_problems`` (``RPGConfigError``)."""
    from omegaconf import OmegaConf

    chosen = backend(req.backend)
    sizes = None if chosen.TINY_TASK else memory_sizes(req.env)
    cfg, settings = composed or compose(overrides, req.root)
    print(f"# {describe_variant(v, cfg, launch_notes(v, req, user))}".replace("\n", "\n# "))
    if not any(override_key(o) == REWARD_PATH for o in overrides):
        _show_cluster_reward_path(cfg, req.root, req.run_root)
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
