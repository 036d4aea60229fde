"""The environment of a trainer run started on this machine, whatever the backend (rpg.launch.harness).

* ``RUN_ENV``: variables every local run sets (no tokenizer threads, no Ray auth token file, no usage
  stats, no W&B, Hydra's full errors in the trainer's log);
* ``external_modules``: the ``VERL_USE_EXTERNAL_MODULES`` list (modules ``import verl`` loads in every
  process), a backend's registration first;
* ``forwarded_env_overrides``: hand environment variables to every Ray process explicitly (Ray workers on
  this node inherit the driver's environment; the forward keeps it right when they do not, e.g. on a
  pre-started cluster).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Every local run of the trainer (the CPU backend, and the GPU smoke run of rpg.backends.gpu).
RUN_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_AUTH_MODE": "disabled",  # ray 2.60 would otherwise write ~/.ray/auth_token
    "RAY_USAGE_STATS_ENABLED": "0",
    "WANDB_MODE": "disabled",
    "HYDRA_FULL_ERROR": "1",
}


def external_modules(extra: Iterable[str] = (), base: str | None = None, first: Iterable[str] = ()) -> str:
    """Comma list for VERL_USE_EXTERNAL_MODULES: ``first`` (a backend's registration), then ``base`` and
    ``extra``, each once."""
    mods = list(first)
    for m in [*(base or "").split(","), *extra]:
        m = m.strip()
        if m and m not in mods:
            mods.append(m)
    return ",".join(mods)


def _quote(value: str) -> str:
    """Hydra string literal (env var values must stay strings: '1', not the int 1)."""
    if "'" in value:
        raise ValueError(f"cannot forward an environment value containing a single quote: {value!r}")
    return f"'{value}'"


def forwarded_env_overrides(env: Mapping[str, str], keys: Iterable[str]) -> list[str]:
    """Overrides that hand ``env[key]`` (for each of ``keys`` present) to every Ray process."""
    return [f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}={_quote(env[key])}" for key in keys if key in env]
