"""Every rule the workers enforce is checked in the driver, before Ray: the loss library's own rules
(``rpg.losses.RULES``, enumerated here) fire in the driver with the recipe key they read, and
``DRY_RUN=1`` on a paper script rejects exactly what a launch would (exit 2, one line)."""

import contextlib
import io

import pytest

from rpg.losses import RULES
from rpg.verl.settings import RPGConfigError, loss_key

from test_verl_config import apply


def _overrides(violation: dict) -> list[str]:
    """The rule's violating settings as recipe overrides (None -> null)."""
    return [f"{loss_key(k)}={'null' if v is None else v}" for k, v in violation.items()]


# grpo_corrected is validated as form=differentiable (its KL is w * k3, rpg.verl.settings.loss_config): the
# one rule that needs form=reinforce cannot fire for it (its kl_clamp is allowed, tests/test_verl_adapter.py)
CASES = [(rule, name) for name in ("rpg", "grpo_corrected") for rule in RULES
         if not (name == "grpo_corrected" and rule.violation.get("form") == "reinforce")]


@pytest.mark.parametrize("rule,loss_name", CASES, ids=[f"{n}-{r.field}:{r.expected[:30]}" for r, n in CASES])
def test_every_library_rule_fires_in_the_driver(rule, loss_name):
    """The driver builds the workers' RPGLossConfig (``rpg.verl.settings.loss_config``): a violation of any
    library rule is refused there, naming the recipe key and what the rule allows."""
    assert len(CASES) == 2 * len(RULES) - 1
    with pytest.raises(RPGConfigError) as err:
        apply(f"rpg.loss.name={loss_name}", *_overrides(rule.violation))
    text = str(err.value)
    assert text.startswith(f"{loss_key(rule.field)}=") and rule.expected in text and "\n" not in text


SCRIPT = "run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28"
WORKER_ONLY_BEFORE = [  # each passed DRY_RUN and failed 45-52 s into a launch, inside a Ray worker
    (["rpg.loss.form=reinforce", "rpg.loss.kl_clamp=1.0"], "rpg.loss.kl_clamp=1.0 is invalid: expected None with form='reinforce'"),
    (["rpg.loss.form=differentiable", "rpg.loss.fd_clip=algorithm1", "rpg.loss.divergence=ufkl"],
     "rpg.loss.divergence='ufkl' is invalid: expected 'rkl' or 'urkl' with fd_clip='algorithm1'"),
    (["actor_rollout_ref.actor.clip_ratio_low=1.5"], "actor_rollout_ref.actor.clip_ratio_low=1.5 is invalid: expected a number in (0, 1)"),
    (["actor_rollout_ref.actor.clip_ratio_high=-0.1"], "actor_rollout_ref.actor.clip_ratio_high=-0.1 is invalid: expected a number > 0"),
]


@pytest.mark.parametrize("overrides,line", WORKER_ONLY_BEFORE, ids=[" ".join(o) for o, _ in WORKER_ONLY_BEFORE])
def test_dry_run_of_a_4b_script_rejects_what_a_worker_would(overrides, line, capsys, tmp_path):
    from rpg.launch.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        code = main([SCRIPT, *overrides], {"DRY_RUN": "1", "DATA_DIR": str(tmp_path)})
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("rpg.launch: warning:")]
    assert code == 2
    assert len(err) == 1 and err[0].startswith("rpg config error: ") and line in err[0], err
