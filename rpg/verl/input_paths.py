"""A run's local input paths, checked in the driver before Ray starts (``rpg.verl.main``), one line per problem.

Without the check a missing data file or model directory surfaces after Ray and the workers started (a missing
model directory as a misleading Hugging Face repo-id error). ``check_input_paths`` names the key and the path of
each problem (the driver prints them and exits 2; under ``DRY_RUN=1`` a path absent from this machine is a warning,
it may exist where the run runs): the data files (``rpg.data.checks.data_problems``), the model-like keys (a local
path or a hub repo id, ``model_path_problem``), the custom reward function's file and the resume folder.
``resolve_resume`` pins the checkpoint a resume loads (``rpg.verl.checkpoints``); ``check_run_names`` keeps
``trainer.project_name`` and ``trainer.experiment_name`` one directory level each.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from rpg.data.checks import DATA_KEYS, Absent, data_problems
from rpg.reward.scored_sources import reward_name_problem
from rpg.verl.errors import ERROR_PREFIX
from rpg.config import RPGConfigError, config_value

DATA_HINT = "Prepare data files with `python -m rpg.data prepare-all --out-dir data/` (docs/data-and-reports.md)"
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"^{_PART}(?:/{_PART})?$")
MODEL_KEYS = ("actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path",
              "actor_rollout_ref.model.hf_config_path", "data.tokenizer")


class InputPathError(RPGConfigError):
    """Local input paths that do not exist or data files verl cannot use: ``lines``, one per problem naming
    the key and the path (``error_line`` prints each); the message joins them with ``; ``."""

    def __init__(self, problems: list[str]):
        lines = list(problems)
        missing = [i for i, p in enumerate(lines) if p.startswith(DATA_KEYS) and p.endswith("no such file")]
        if missing:
            lines[missing[-1]] += f". {DATA_HINT}"
        self.lines = lines
        super().__init__("; ".join(lines))


def error_line(err: Exception) -> str:
    """The one line the driver and the launcher print for a bad config value (then exit code 2); an
    error with ``lines`` (``rpg.backends.gpu.preflight.GpuCheckError``) gives one line per problem,
    each with the error's own ``prefix``."""
    prefix = getattr(err, "prefix", ERROR_PREFIX)
    return "\n".join(f"{prefix}: {line}" for line in (getattr(err, "lines", None) or [str(err)]))


def is_remote(value: str) -> bool:
    return "://" in value


def looks_like_hub_id(value: str) -> bool:
    """``name`` or ``org/name`` as the Hugging Face hub accepts it: one slash at most, each part made of letters,
    digits and ``_ . -``, starting and ending with a letter or digit, no ``..``."""
    return bool(_HUB_ID.match(value)) and ".." not in value


def _exists(value: str) -> bool:
    return Path(value).expanduser().exists()


def model_path_problem(key: str, value: Any) -> str | None:
    """None if ``value`` is remote (contains ``://``), an existing path or shaped like a repo id
    (``looks_like_hub_id``); else the one-line reason. A value that looks local (starts with ``/``, ``~``, ``./``
    or ``../``, contains ``\\``, has two slashes or more) must exist: a relative ``models/qwen`` that does not exist
    is taken for the repo id ``models/qwen`` (write ``./models/qwen`` to have it checked as a path)."""
    if value is None or (isinstance(value, str) and (is_remote(value) or _exists(value) or looks_like_hub_id(value))):
        return None
    if not isinstance(value, str):
        return f"{key}={value!r} is not a path"
    return Absent(f"{key}={value}: no such file or directory (and not a Hugging Face repo id 'org/name')")


def resume_path_problem(value: Any) -> str | None:
    key = "trainer.resume_from_path"
    if not isinstance(value, str) or not value:
        return f"{key}={value!r}: trainer.resume_mode=resume_path needs a checkpoint directory .../global_step_<N>"
    if not re.fullmatch(r"global_step_\d+", Path(value).name):
        return f"{key}={value}: expected a checkpoint directory named global_step_<N>"
    if not os.path.isdir(value):
        return Absent(f"{key}={value}: no such directory")
    return None


def name_problem(key: str, value: Any) -> str | None:
    """None if ``value`` can name one directory level (no separator, not '.'/'..', not empty)."""
    if not isinstance(value, str) or not value.strip() or value in (".", "..") or any(c in value for c in "/\\\0"):
        return (f"{key}={value!r}: a run name becomes a directory (checkpoints, logs) and must stay inside it: "
                "no '/' or '\\', not '.' or '..', not empty")
    return None


def check_run_names(cfg) -> None:
    """``RPGConfigError`` (one line) if the project or experiment name could leave its directory, or
    ``trainer.resume_mode`` is not a mode verl knows (checked here, not only when the resume is
    planned, so that DRY_RUN refuses it too)."""
    from rpg.verl.checkpoints import resume_mode_problem

    problems = [name_problem(k, _get(cfg, k)) for k in ("trainer.project_name", "trainer.experiment_name")]
    problems.append(resume_mode_problem(_get(cfg, "trainer.resume_mode")))
    if any(problems):
        raise RPGConfigError("; ".join(p for p in problems if p))


def resolve_resume(cfg) -> str | None:
    """Decide the checkpoint the run resumes from (``rpg.verl.checkpoints.plan_resume``) and pin it in
    ``cfg`` (``resume_mode=resume_path``); returns the line to print (None: no resume), which the driver prints for
    every run and the launchers show (``rpg.verl.errors.RESUME_LINE_STARTS``).
    Raises ``ResumeError`` (one line) when the run cannot continue where it stopped."""
    from omegaconf import OmegaConf

    from rpg.verl.checkpoints import ALLOW_CHANGED, plan_resume, recorded_settings
    from rpg.verl.resume_world_size import world_size

    mode = _get(cfg, "trainer.resume_mode")
    plan = plan_resume(mode, _get(cfg, "trainer.default_local_dir"), _get(cfg, "trainer.resume_from_path"),
                       settings=recorded_settings(cfg), allow_changed=bool(_get(cfg, ALLOW_CHANGED)),
                       world_size=world_size(_get(cfg, "trainer.n_gpus_per_node"), _get(cfg, "trainer.nnodes")),
                       strategy=_get(cfg, "actor_rollout_ref.actor.strategy"),
                       trainer_mode=_get(cfg, "trainer.v1.trainer_mode"))
    if plan.folder is not None:
        OmegaConf.update(cfg, "trainer.resume_mode", "resume_path")
        OmegaConf.update(cfg, "trainer.resume_from_path", plan.folder)
    return plan.note or fresh_start_line(mode, _get(cfg, "trainer.default_local_dir"))


def fresh_start_line(mode, default_local_dir) -> str:
    """The resume decision of a run that starts at step 0 (``RESUME_LINE_STARTS``: the launchers show it)."""
    root = os.path.abspath(str(default_local_dir))
    if mode == "disable":
        return f"fresh start (step 0) because trainer.resume_mode=disable; checkpoints go to {root}"
    return f"fresh start (step 0) because {root} holds no checkpoint yet (trainer.resume_mode={mode})"


def _get(cfg, key: str) -> Any:
    return config_value(cfg, key)


def _needs_critic(cfg) -> bool:
    import warnings

    from verl.trainer.ppo.utils import need_critic

    with warnings.catch_warnings():  # it warns that the critic is off; verl's validate_config says so again
        warnings.simplefilter("ignore")
        return need_critic(cfg)


def input_path_problems(cfg, *, use_critic: bool | None = None) -> list[str]:
    """One line per missing local input path of the composed config ``cfg``, and per problem of its data
    files (``rpg.data.checks.data_problems``); empty: all present and usable. A path that does not exist on this
    machine is an ``Absent`` line (``refusals`` leaves those out). Remote values (``://``) are never checked.

    * ``data.train_files``, ``data.val_files`` (a path or a non-empty list): files verl can read, in its layout, each
      ``data_source`` scored by the run's reward function;
    * ``actor_rollout_ref.model.path``, ``.tokenizer_path``, ``.hf_config_path``, ``data.tokenizer`` (and
      ``critic.model.path`` with a critic): ``model_path_problem``;
    * ``reward.custom_reward_function.path`` when set: an existing file defining ``.name`` (read, never run);
    * ``trainer.resume_from_path`` with ``resume_mode=resume_path``: an existing ``global_step_<N>`` directory (verl
      reads the step from its name), relative to the current directory, ``~`` not expanded (as verl does).

    ``use_critic=None``: ask verl (``need_critic``) whether ``critic.model.path`` is used.
    """
    if use_critic is None:
        use_critic = _needs_critic(cfg)
    problems: list[str | None] = list(data_problems(lambda key: _get(cfg, key)))
    for key in MODEL_KEYS + (("critic.model.path",) if use_critic else ()):
        problems.append(model_path_problem(key, _get(cfg, key)))
    reward = _get(cfg, "reward.custom_reward_function.path")
    if reward is not None and not is_remote(str(reward)) and not Path(str(reward)).expanduser().is_file():
        line = f"reward.custom_reward_function.path={reward}: no such file"
        problems.append(line if Path(str(reward)).expanduser().exists() else Absent(line))
    problems.append(reward_name_problem(reward, _get(cfg, "reward.custom_reward_function.name")))
    if _get(cfg, "trainer.resume_mode") == "resume_path":
        problems.append(resume_path_problem(_get(cfg, "trainer.resume_from_path")))
    return [p for p in problems if p]


def refusals(problems: list[str]) -> list[str]:
    """The lines of ``input_path_problems`` but the ``Absent`` ones: what is wrong with what this machine holds or
    with the values themselves (a data file in the wrong layout, an empty list, ...), refused by ``DRY_RUN=1`` too."""
    return [p for p in problems if not isinstance(p, Absent)]


def check_input_paths(cfg, *, use_critic: bool | None = None) -> None:
    """Raise ``InputPathError`` (one line per problem) if any input path is missing or a data file unusable."""
    problems = input_path_problems(cfg, use_critic=use_critic)
    if problems:
        raise InputPathError(problems)
