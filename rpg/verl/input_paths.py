"""A run's local input paths, checked in the driver before Ray starts (``rpg.verl.main``), one line per problem.

Without the check a missing data file or model directory surfaces after Ray and the workers started (a missing
model directory as a misleading Hugging Face repo-id error). ``check_input_paths`` names the key and the path of
each problem (the driver prints them and exits 2; under ``DRY_RUN=1`` a path absent from this machine is a warning,
it may exist where the run runs): the data files (``rpg.data.checks.data_problems``), the model-like keys (a local
path or a hub repo id, ``model_path_problem``; a local folder's config and tokenizer load,
``model_folder_problems``), the custom reward function's file and the resume folder.
``resolve_resume`` pins the checkpoint a resume loads (``rpg.verl.checkpoints``); ``check_run_names`` keeps
``trainer.project_name`` and ``trainer.experiment_name`` one directory level each, and every file name the run
writes within ``NAME_MAX`` bytes.
"""

from __future__ import annotations

import hashlib
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
NAME_MAX = 255  # bytes (UTF-8) of one file name, a path component (ext4, xfs, btrfs, and most others)
SEGMENTS_RESERVED = 9999  # the name check leaves room for this many segments of a metrics history (a start each)
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


def model_folder_problems(get, *, use_critic: bool = False) -> list[str]:
    """One line per local model folder without its weights, or whose config or tokenizer does not load as verl's
    ``HFModelConfig`` and engine load them in every worker, after Ray (a folder without them: a 60-line traceback
    there). Read with ``get`` (dotted key -> value, None when unset): the weights at ``<model>.path``; the config at
    ``<model>.hf_config_path``, else ``<model>.path``; the tokenizer at
    ``<model>.tokenizer_path``, else ``<model>.path``, and at ``data.tokenizer``; ``<model>``: the actor's (the
    reference's too), the critic's with ``use_critic``. Only paths that exist here are read (an absent one is
    ``model_path_problem``'s, a hub name the hub's), with ``local_files_only``: nothing is downloaded."""
    wanted: dict[str, tuple[list[str], bool]] = {}  # key -> (what it must hold, trust_remote_code)
    for model in ("actor_rollout_ref.model", *(("critic.model",) if use_critic else ())):
        trust = bool(get(f"{model}.trust_remote_code"))
        wanted[f"{model}.path"] = (["weights"], trust)
        for what, own in (("config", "hf_config_path"), ("tokenizer", "tokenizer_path")):
            key = f"{model}.{own}" if get(f"{model}.{own}") else f"{model}.path"
            wanted.setdefault(key, ([], trust))[0].append(what)
    wanted.setdefault("data.tokenizer", (["tokenizer"], bool(get("actor_rollout_ref.model.trust_remote_code"))))
    problems = []
    for key, (whats, trust) in wanted.items():
        value = get(key)
        if isinstance(value, str) and value and not is_remote(value) and _exists(value):
            problems.append(model_folder_problem(key, value, whats, trust_remote_code=trust))
    return [p for p in problems if p]


def model_folder_problem(key: str, value: str, whats: list[str], *, trust_remote_code: bool = False) -> str | None:
    """None if the local folder ``value`` holds each of ``whats`` as transformers loads it: "weights" (one of the
    weight files ``from_pretrained`` looks for), "config" (``AutoConfig``), "tokenizer" (``AutoTokenizer``, which must
    encode text: transformers 5 builds an empty tokenizer from a config alone); else one line naming the key, the
    folder and what is missing or does not load."""
    folder = Path(value).expanduser()
    if not folder.is_dir():
        return (f"{key}={value}: a file, not a model folder (a Hugging Face model folder: config.json, weights, "
                "tokenizer)")
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    files = {"weights": (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME),
             "config": ("config.json",), "tokenizer": ("tokenizer.json", "tokenizer_config.json")}
    missing = [" or ".join(files[w]) for w in whats if not any((folder / n).is_file() for n in files[w])]
    if missing:
        return (f"{key}={value}: the folder has no {' and no '.join(missing)} (a Hugging Face model folder: config.json, "
                "weights, tokenizer)")
    for what in (w for w in whats if w != "weights"):
        try:
            loaded = (AutoConfig if what == "config" else AutoTokenizer).from_pretrained(
                str(folder), local_files_only=True, trust_remote_code=trust_remote_code)
            if what == "tokenizer" and not loaded.encode("Answer: 42", add_special_tokens=False):
                return f"{key}={value}: its tokenizer encodes nothing (no vocabulary: tokenizer.json or its vocab files)"
        except Exception as e:  # noqa: BLE001 - whatever transformers raises for this folder: one line naming it
            first = (str(e).strip().splitlines() or [""])[0]
            return f"{key}={value}: its {what} does not load ({type(e).__name__}: {first})"
    return None


def resume_path_problem(value: Any) -> str | None:
    key = "trainer.resume_from_path"
    if not isinstance(value, str) or not value:
        return f"{key}={value!r}: trainer.resume_mode=resume_path needs a checkpoint directory .../global_step_<N>"
    if not re.fullmatch(r"global_step_\d+", Path(value).name):
        return f"{key}={value}: expected a checkpoint directory named global_step_<N>"
    if not os.path.isdir(value):
        return Absent(f"{key}={value}: no such directory")
    return None


def longest_file_name(experiment: str) -> str:
    """The longest file name a run writes from its experiment name: its metrics history's segment
    ``SEGMENTS_RESERVED`` (``rpg.metrics_log.history``; the checkpoint and TensorBoard folders are the name itself)."""
    from rpg.metrics_log.history import segment_path

    return segment_path(Path(f"{experiment}.jsonl"), SEGMENTS_RESERVED).name


def fitted_name(name: str) -> str:
    """``name`` when ``longest_file_name`` of it fits ``NAME_MAX`` bytes, else its longest prefix that fits with
    ``~`` and the first 12 hex digits of its sha256 (a name derived from overrides: the digest keeps it unique)."""
    room = NAME_MAX - (len(longest_file_name(name).encode()) - len(name.encode()))
    if len(name.encode()) <= room:
        return name
    tail = "~" + hashlib.sha256(name.encode()).hexdigest()[:12]
    head = name.encode()[:room - len(tail)].decode(errors="ignore")  # whole UTF-8 characters only
    return head + tail


def name_problem(key: str, value: Any, *, experiment: bool = False) -> str | None:
    """None if ``value`` can name one directory level (no separator, not '.'/'..', not empty) in ``NAME_MAX``
    bytes; ``experiment``: an experiment name, whose longest file name (``longest_file_name``) must fit."""
    if not isinstance(value, str) or not value.strip() or value in (".", "..") or any(c in value for c in "/\\\0"):
        return (f"{key}={value!r}: a run name becomes a directory (checkpoints, logs) and must stay inside it: "
                "no '/' or '\\', not '.' or '..', not empty")
    longest = longest_file_name(value) if experiment else value
    if (size := len(longest.encode())) > NAME_MAX:
        room = NAME_MAX - (size - len(value.encode()))
        return (f"{key}={value[:40]!r}... is {len(value.encode())} bytes (UTF-8): the run writes files named "
                f"{'<name>' + longest[len(value):] if experiment else 'so'} and a file name holds at most {NAME_MAX} "
                f"bytes; give a name of at most {room} bytes")
    return None


def written_path_problems(cfg) -> list[str]:
    """One line per component over ``NAME_MAX`` bytes of a folder the run writes: ``trainer.default_local_dir``,
    the metrics log's (``VERL_FILE_LOGGER_ROOT``, with verl's file logger) and TensorBoard's (``TENSORBOARD_DIR``)."""
    from rpg.metrics_log.history import PATH_ENV, ROOT_ENV, base_path, logs_to_file

    environ = run_environ(cfg)
    project, experiment = _get(cfg, "trainer.project_name"), _get(cfg, "trainer.experiment_name")
    loggers = _get(cfg, "trainer.logger")
    folders = {"trainer.default_local_dir": _get(cfg, "trainer.default_local_dir")}
    if logs_to_file(loggers):
        folders[PATH_ENV if environ.get(PATH_ENV) else ROOT_ENV] = str(base_path(project, experiment, environ).parent)
    if "tensorboard" in ([loggers] if isinstance(loggers, str) else list(loggers or ())):
        folders["TENSORBOARD_DIR"] = environ.get("TENSORBOARD_DIR") or f"tensorboard_log/{project}/{experiment}"
    problems = []
    for source, folder in folders.items():
        if not isinstance(folder, str):
            continue
        for part in Path(os.path.abspath(os.path.expanduser(folder))).parts:
            if len(part.encode()) > NAME_MAX:
                problems.append(f"{source}={folder}: its folder name {part[:40]!r}... is {len(part.encode())} bytes "
                                f"(UTF-8), over the {NAME_MAX} a file name holds")
                break
    return problems


def run_environ(cfg) -> dict[str, str]:
    """The environment of the run's Ray processes: this one's, then the launcher's
    ``ray_kwargs.ray_init.runtime_env.env_vars`` (where VERL_FILE_LOGGER_ROOT and TENSORBOARD_DIR reach them)."""
    worker_env = _get(cfg, "ray_kwargs.ray_init.runtime_env.env_vars") or {}
    return {**os.environ, **{k: str(v) for k, v in dict(worker_env).items()}}


def check_run_names(cfg) -> None:
    """``RPGConfigError`` (one line) if the project or experiment name could leave its directory or make a file
    name the file system refuses (``name_problem``, ``written_path_problems``: ``OSError`` 36 at the first log
    segment or checkpoint, hours into a run), or ``trainer.resume_mode`` is not a mode verl knows (checked here,
    not only when the resume is planned, so that DRY_RUN refuses it too)."""
    from rpg.verl.checkpoints import resume_mode_problem

    problems = [name_problem(k, _get(cfg, k), experiment=k.endswith("experiment_name"))
                for k in ("trainer.project_name", "trainer.experiment_name")]
    if not any(problems):
        problems += written_path_problems(cfg)
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
      ``critic.model.path`` with a critic): ``model_path_problem``; a local folder's config and tokenizer load
      (``model_folder_problems``);
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
    problems += model_folder_problems(lambda key: _get(cfg, key), use_critic=use_critic)
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
