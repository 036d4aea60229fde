"""Each shipped paper run's settings as a Hydra experiment config: ``recipe/rpg/config/experiment/<run name>.yaml``.

The run-name grammar (``rpg.launch.variants``) stays the one source: ``render_experiment(v)`` writes every
setting the name decides (``name_settings``), the model, the data files and the run's name, each with a
short comment, on top of the paper setup (``paper/default.yaml``). The launcher composes a shipped run, or a
name whose file the user wrote (``user_file``), with ``+experiment=<run name>`` (``variant_overrides``);
``python recipe/rpg/main_rpg.py +experiment=<run name>`` composes the same run. A test checks that every file is
what this module writes.

    python -m rpg.launch.experiments --write    # (re)write the file of every shipped script
    python -m rpg.launch.experiments --check    # exit 1 naming each file that differs (or is missing / extra)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from rpg.common.checkout import CHECKOUT, RECIPE_CONFIG_DIR, RECIPE_DIR
from rpg.config.kinds import yaml_value
from rpg.launch.variants import (PAPER_SETUP, TRAIN_SET, Variant, known_names, name_settings, paper_refs, paper_row,
                                 parse, to_overrides)

GROUP = "experiment"
EXPERIMENT_DIR = RECIPE_CONFIG_DIR / GROUP  # relative to the checkout
DATA_DIR = "data"  # `python -m rpg.data prepare-all` writes the sets here; relative paths resolve from the working dir

_A, _R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
NOTES = {  # a comment per key: what it is and where the paper states it
    "actor_rollout_ref.model.path": "Hugging Face id or a local folder (the launcher: MODEL_PATH)",
    "data.train_files": "DAPO-Math-17k, English (Sec. 5), relative to the working folder",
    "data.val_files": "AIME 2024/2025, AMC 2023 (+ Minerva, OlympiadBench at 4K: Table 7); mean@32",
    "data.max_prompt_length": "the name's context (_ctx2k|_ctx4k|_ctx8k; 7b: 2K)",
    "data.max_response_length": "L_max: the same context",
    "data.apply_chat_template_kwargs.enable_thinking": "Qwen3's chat template with thinking off",
    f"{_A}.ppo_max_token_len_per_gpu": "micro-batch token budget (packing only, not the math)",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "the same budget",
    f"{_R}.log_prob_max_token_len_per_gpu": "the same budget",
    f"{_R}.max_num_batched_tokens": "prompt + response",
    f"{_A}.clip_ratio_low": "eps_low: PPO clip / RPG-Style Clip (Eq. 4.1)",
    f"{_A}.clip_ratio_high": "eps_high",
    f"{_A}.clip_ratio_c": "dual-clip c",
    f"{_A}.optim.lr": "App. H: 1e-6; the authors' 7B RPG-REINFORCE scripts: 5e-7",
    "reward.reward_kwargs.overlong_buffer_cfg.enable": "DAPO's overlong reward shaping",
    "reward.reward_kwargs.overlong_buffer_cfg.len": "buffer L_max / 4",
    "algorithm.adv_estimator": "rpg: R - group mean (no std); grpo; reinforce_plus_plus(_baseline)",
    "algorithm.norm_adv_by_std_in_grpo": "divide by the group's std (GRPO, DAPO)",
    "algorithm.filter_groups.enable": "DAPO's dynamic sampling",
    "rpg.loss.name": "rpg: the RPG losses; verl: verl's own actor loss",
    "rpg.reference.mode": "sampler: the iterative reference (pi_old); fixed: the initial model",
    "rpg.optimizer": "adamw, or schedulefree (_schedulefree)",
    "rpg.loss.divergence": "the KL of the name (unused when beta = 0)",
    "rpg.loss.form": "reinforce: RPG-REINFORCE (_rf); differentiable: the fully differentiable loss",
    "rpg.loss.beta": "KL coefficient beta",
    "rpg.loss.clip": "RPG-Style Clip (_rf_clip_ppo)",
    f"{_A}.use_kl_loss": "verl's KL loss (rfpp, rfppb, grpo); RPG's KL is in its loss",
    f"{_A}.kl_loss_type": "k1 (kl) or k3 (low_var_kl)",
    f"{_A}.kl_loss_coef": "KL coefficient",
    f"{_R}.gpu_memory_utilization": "memory only: vLLM's share of each GPU (docs/memory.md)",
    "trainer.project_name": "the launcher: PROJECT_NAME",
    "trainer.experiment_name": "the launcher: EXP_NAME",
}


def experiment_path(name: str) -> Path:
    return CHECKOUT / EXPERIMENT_DIR / f"{name}.yaml"


def variant_overrides(v: Variant, user: Sequence[str] = ()) -> list[str]:
    """The overrides that give a run its settings: ``+experiment=<name>`` for a shipped script (its file) or a
    name whose file the user wrote (``user_file``), the grammar's overrides for any other name it reads."""
    return [f"+{GROUP}={v.name}"] if v.name in known_names() or user_file(v.name, user) else to_overrides(v)


def user_file(name: str, user: Sequence[str] = ()) -> bool:
    """Whether Hydra finds ``experiment/<name>.yaml`` on the recipe config's search path, with the user's
    ``hydra.searchpath`` override if any (Hydra's config loader: where ``+experiment=<name>`` is read from). Such a
    search path replaces the recipe's: ``hydra.searchpath=[pkg://verl.trainer.config,file://<folder>]`` adds a
    folder holding ``experiment/<name>.yaml``. A search path Hydra refuses is left to the composition's line."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType
    from hydra.errors import HydraException
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    from rpg.common.override_lists import override_key
    from rpg.launch.config_keys import RECIPE_CONFIG_NAME

    searchpath = [o for o in user if override_key(o) == "hydra.searchpath"][-1:]
    caller = get_gh_backup()  # a caller's own Hydra initialisation is restored after
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CHECKOUT / RECIPE_CONFIG_DIR), version_base=None):
            return name in GlobalHydra.instance().config_loader().get_group_options(
                GROUP, ObjectType.CONFIG, RECIPE_CONFIG_NAME, searchpath)
    except HydraException:
        return False
    finally:
        restore_gh_from_backup(caller)


def file_note(v: Variant, user: Sequence[str] = ()) -> str | None:
    """One line when the run composes an experiment file that is not what the grammar writes for its name: a
    shipped file that differs (``stale_files``' comparison; the settings it gives otherwise named), or a file the
    user wrote for a name without a script."""
    if v.name in known_names():
        if not _differs(v.name):
            return None
        path = experiment_path(v.name)
        changed = file_changes(v, path) if path.is_file() else []
        return (f"{EXPERIMENT_DIR / v.name}.yaml differs from what the run name's grammar writes (python -m "
                f"rpg.launch.experiments --check): the run composes the file"
                + (f", which sets {', '.join(changed)}" if changed else ""))
    if user_file(v.name, user):
        return (f"{v.name} has no script: the run composes the experiment file {GROUP}/{v.name}.yaml on Hydra's search "
                f"path (+{GROUP}={v.name}), not the settings the grammar gives the name")
    return None


def file_changes(v: Variant, path: Path) -> list[str]:
    """``key=value (the name: value)`` of each setting the name decides that the experiment file at ``path`` gives
    another value (the file is read as the run's composition read it)."""
    from omegaconf import OmegaConf

    from rpg.common.override_lists import parse_overrides

    loaded = OmegaConf.load(path)
    out = []
    for p in parse_overrides(name_settings(v)):
        x = OmegaConf.select(loaded, p.key, default=None)
        if isinstance(x, bool) != isinstance(p.value, bool) or x != p.value:
            out.append(f"{p.key}={x if OmegaConf.is_config(x) else yaml_value(x)} (the name: {p.value_text})")
    return out


def experiment_settings(v: Variant) -> list[tuple[str, object]]:
    """(key, value) of every setting of the run's file, in order: model, data, the name's settings, the names."""
    from rpg.common.override_lists import parse_overrides

    files = [("actor_rollout_ref.model.path", v.model),
             ("data.train_files", f"{DATA_DIR}/{TRAIN_SET}.parquet"),
             ("data.val_files", [f"{DATA_DIR}/{s}.parquet" for s in v.val_sets])]
    names = [("trainer.project_name", "rpg"), ("trainer.experiment_name", v.name)]
    return [*files, *((p.key, p.value) for p in parse_overrides(name_settings(v))), *names]


WIDTH, COMMENT_COLUMN = 118, 56  # the longest line; where a note starts


def _commented(text: str, note: str | None) -> list[str]:
    """``text`` with ``note`` after it at ``COMMENT_COLUMN``, or on a line of its own above it when too long."""
    if not note:
        return [text]
    column = max(COMMENT_COLUMN, len(text) + 2)
    if column + 2 + len(note) <= WIDTH:
        return [f"{text.ljust(column)}# {note}"]
    indent = text[:len(text) - len(text.lstrip())]
    return [f"{indent}# {note}", text]


def render_experiment(v: Variant) -> str:
    """The run's experiment config: a header naming the run and its paper row, ``defaults`` (the paper setup),
    then every setting nested by key, each with its note."""
    refs = ", ".join(paper_refs(v)) or "not in the paper"
    script = RECIPE_DIR / ("4b" if v.model_tag == "4b" else "7b") / f"{v.name}.sh"
    paper = PAPER_SETUP.removeprefix("+").split("=")
    header = [
        "# @package _global_",
        f"# {v.name}: {paper_row(v)} [{refs}]",
        *([f"# irregular name: {v.irregular}"] if v.irregular else []),
        "# Written by `python -m rpg.launch.experiments --write` from the run name (rpg/launch/variants.py); a test",
        "# checks. Launched by its script (which adds paths, cluster size, loggers):",
        f"#   {script}",
        "# or from the checkout, the same settings:",
        f"#   python {RECIPE_DIR}/main_rpg.py +{GROUP}={v.name}",
        "defaults:",
        f"  - /{paper[0]}: {paper[1]}  # recipe/rpg/config/paper/default.yaml: the setup every paper run shares",
        "  - _self_",
    ]
    tree: dict = {}
    for key, value in experiment_settings(v):
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = (key, value)
    lines: list[str] = []

    def emit(node: dict, depth: int) -> None:
        for part, child in node.items():
            indent = "  " * depth
            if isinstance(child, dict):
                lines.append(f"{indent}{part}:")
                emit(child, depth + 1)
            else:
                key, value = child
                if isinstance(value, list):  # one item a line
                    lines.extend(_commented(f"{indent}{part}:", NOTES.get(key)))
                    lines.extend(f"{indent}  - {yaml_value(x)}" for x in value)
                else:
                    lines.extend(_commented(f"{indent}{part}: {yaml_value(value)}", NOTES.get(key)))

    for part, child in tree.items():
        lines.append("")
        emit({part: child}, 0)
    return "\n".join(header + lines) + "\n"


def stale_files() -> list[str]:
    """What differs from the grammar's output: each shipped run's file that is missing or not what
    ``render_experiment`` writes, and each file without a shipped script (paths relative to the checkout)."""
    names = known_names()
    problems = [f"{EXPERIMENT_DIR / n}.yaml" for n in names if _differs(n)]
    folder = CHECKOUT / EXPERIMENT_DIR
    extra = sorted(p.stem for p in folder.glob("*.yaml") if p.stem not in names) if folder.is_dir() else []
    return problems + [f"{EXPERIMENT_DIR / n}.yaml (no script)" for n in extra]


def _differs(name: str) -> bool:
    """The shipped run's file is missing or not what ``render_experiment`` writes."""
    return not experiment_path(name).is_file() or experiment_path(name).read_text() != render_experiment(parse(name))


def write_all() -> list[Path]:
    """(Re)write every shipped run's file; remove files without a script. Returns the files written."""
    folder = CHECKOUT / EXPERIMENT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    names = known_names()
    for p in folder.glob("*.yaml"):
        if p.stem not in names:
            p.unlink()
    written = []
    for n in names:
        path, text = experiment_path(n), render_experiment(parse(n))
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        written = write_all()
        print(f"{len(written)} of {len(known_names())} experiment files written under {EXPERIMENT_DIR}")
        return 0
    if argv == ["--check"]:
        stale = stale_files()
        for line in stale:
            print(f"rpg.launch.experiments: differs from the run name's settings: {line}", file=sys.stderr)
        if stale:
            print("rpg.launch.experiments: regenerate with python -m rpg.launch.experiments --write", file=sys.stderr)
        return 1 if stale else 0
    print("usage: python -m rpg.launch.experiments --write | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
