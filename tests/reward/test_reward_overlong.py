"""Overlong shaping through verl's own DAPO reward manager (v1 reward loop), on CPU, no Ray.

T29 (docs/math.md#testable-identities): L_max = 2048, B = 512, factor 1 -> penalty 0 at 1536 tokens, -0.5 at 1792, -1 at 2048,
added to the +-1 score from rpg.reward.compute_score.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls

from rpg.reward import compute_score

PROMPT_LEN, MAX_RESP = 4, 2048


class _Tokenizer:
    """The manager only calls decode(); the text stands for the decoded response."""

    def __init__(self, text: str):
        self.text = text

    def decode(self, ids, skip_special_tokens=True):
        return self.text


def _manager(text: str, enable: bool = True):
    cfg = OmegaConf.create({"reward": {"reward_kwargs": {
        "overlong_buffer_cfg": {"enable": enable, "len": 512, "penalty_factor": 1.0, "log": True},
        "max_resp_len": MAX_RESP}}})
    return get_reward_manager_cls("dapo")(cfg, _Tokenizer(text), compute_score)


def _item(valid_len: int, data_source="aime2024", gt="42") -> DataProto:
    mask = torch.zeros(1, PROMPT_LEN + MAX_RESP, dtype=torch.long)
    mask[:, : PROMPT_LEN + valid_len] = 1
    return DataProto.from_dict(
        tensors={"prompts": torch.ones(1, PROMPT_LEN, dtype=torch.long),
                 "responses": torch.ones(1, MAX_RESP, dtype=torch.long), "attention_mask": mask},
        non_tensors={"data_source": np.array([data_source], dtype=object),
                     "reward_model": np.array([{"ground_truth": gt}], dtype=object),
                     "extra_info": np.array([{"index": 0}], dtype=object)},
    )


def _run(manager, data):
    out = manager.loop.run_until_complete(manager.run_single(data))
    return float(out["reward_score"]), out["reward_extra_info"]


@pytest.mark.parametrize("length,penalty", [(100, 0.0), (1536, 0.0), (1664, -0.25), (1792, -0.5), (2048, -1.0)])
@pytest.mark.parametrize("text,score", [("...\nAnswer: 42", 1.0), ("...\nAnswer: 41", -1.0)])
def test_t29_overlong_penalty(length, penalty, text, score):
    total, info = _run(_manager(text), _item(length))
    assert float(info["overlong_reward"]) == pytest.approx(penalty)
    assert total == pytest.approx(score + penalty)
    assert info["score"] == score and info["acc"] is (score > 0)


def test_disabled_buffer_gives_the_plain_score():
    total, info = _run(_manager("Answer: 42", enable=False), _item(2048))
    assert total == 1.0 and "overlong_reward" not in info


def test_amc_rows_route_through_rpg_reward_inside_the_manager():
    total, info = _run(_manager("Answer: 27"), _item(10, data_source="amc_23", gt="27"))
    assert total == 1.0 and info["pred"] == "27"
