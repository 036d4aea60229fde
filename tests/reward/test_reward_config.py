"""The reward option reaches a run: ``+reward.custom_reward_function.reward_kwargs.boxed_fallback=true``
is checked by the driver (one line, exit 2 on a bad value) and handed to rpg.reward by verl's loader."""

from __future__ import annotations

import pytest
from messages import names, one_line
from test_verl_config import apply, compose_cfg
from verl.trainer.ppo.reward import get_custom_reward_fn

from rpg.config import RPGConfigError

KW = "+reward.custom_reward_function.reward_kwargs"
BOXED_ONLY = {"data_source": "aime2024", "solution_str": "so the answer is \\boxed{540}.", "ground_truth": "540",
              "extra_info": {}}


def test_default_run_scores_with_the_paper_rule():
    cfg, _ = apply()
    assert cfg.reward.custom_reward_function.name == "compute_score"
    assert cfg.reward.custom_reward_function.path.endswith("rpg/reward/__init__.py")
    assert get_custom_reward_fn(cfg)(**BOXED_ONLY)["score"] == -1.0


def test_boxed_fallback_option_reaches_compute_score_through_verl():
    cfg, _ = apply(f"{KW}.boxed_fallback=true")
    assert get_custom_reward_fn(cfg)(**BOXED_ONLY)["score"] == 1.0
    cfg, _ = apply("reward.custom_reward_function.path=pkg://rpg.reward", f"{KW}.boxed_fallback=false")
    assert get_custom_reward_fn(cfg)(**BOXED_ONLY)["score"] == -1.0


@pytest.mark.parametrize("override, message", [
    (f"{KW}.boxed_falback=true", "reward.custom_reward_function.reward_kwargs: unknown rpg.reward option(s) "
                                 "boxed_falback; allowed: boxed_fallback, strict_box_verify"),
    (f"{KW}.boxed_fallback=1", "reward.custom_reward_function.reward_kwargs.boxed_fallback=1 is invalid; "
                               "expected true or false"),
])
def test_bad_reward_option_is_one_line_before_ray(override, message):
    with pytest.raises(RPGConfigError) as err:
        apply(override)
    assert str(err.value) == message


def test_main_exits_2_on_a_bad_reward_option(capsys):
    from launching import recipe_main

    with pytest.raises(SystemExit) as e:
        recipe_main(compose_cfg(f"{KW}.boxed_fallback=maybe"))
    assert e.value.code == 2
    line = one_line(capsys.readouterr().err.strip())
    assert line.startswith("rpg config error: ")
    names(line, f"{KW.lstrip('+')}.boxed_fallback='maybe'", "true or false")


def test_other_reward_functions_keep_their_own_kwargs(tmp_path):
    f = tmp_path / "r.py"
    f.write_text("def compute_score(*a, anything=None, **k):\n    return 0.0\n")
    cfg, _ = apply(f"reward.custom_reward_function.path={f}", f"{KW}.anything=3")  # not rpg.reward: not checked
    assert cfg.reward.custom_reward_function.reward_kwargs.anything == 3
