"""End to end: a run in which no group can have a reward spread ends at DAPO's refill limit
(``algorithm.filter_groups.max_num_gen_batches``, ``rpg.verl.refill_limit``) with the driver's one stop line and
exit code 1, where verl 0.9.1's replay buffer would sample without end. One trainer launch (sync mode, the tiny
task): a CI stage, not README's suite."""

from __future__ import annotations

import re

import pytest

from rpg.override_lists import hydra_value

pytestmark = [pytest.mark.e2e, pytest.mark.trainer_e2e]

# an answer no response can give: 20 digits, each its own token (rpg.tiny.build's tokenizer), in at most
# data.max_response_length=16 response tokens (rpg.tiny.overrides)
IMPOSSIBLE = "9" * 20
STAMP = re.compile(r"^\[\s*[\d.]+s\] ")  # the harness's time before each line of trainer.log


def test_a_run_whose_groups_all_score_alike_stops_at_the_refill_limit(cpu_trainer, tiny_assets, tmp_path):
    """Every response scores -1 (acc 0), so DAPO's filter drops every group. In sync mode verl's replay buffer
    refills twice the dropped groups, at most ``max_inflight_gen_batches`` (1) x 8 prompts in flight
    (``replay_buffer.py:469-486``): how the refills split into calls follows which groups finished at each poll, so
    the test asserts what the limit guarantees, not one split: the refills of step 1 stay within 2 x 8 prompts, the
    one asked for next would go beyond, and it asks for 1 to 8 prompts; then the run stops before any training step."""
    import pandas as pd

    rows = pd.read_parquet(tiny_assets.train_file)
    rows["reward_model"] = [{**answer, "ground_truth": IMPOSSIBLE} for answer in rows["reward_model"]]
    train = tmp_path / "impossible.parquet"
    rows.to_parquet(train)
    run = cpu_trainer([f"data.train_files={hydra_value(str(train), 'data.train_files')}",
                       "algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc",
                       "algorithm.filter_groups.max_num_gen_batches=2", "trainer.val_before_train=False"],
                      steps=2, check=False, timeout_s=600)
    assert run.returncode == 1 and not run.timed_out, run.tail()
    lines = [STAMP.sub("", line) for line in run.log.splitlines()]
    stops = [line for line in lines if line.startswith("rpg: stopped")]
    assert len(stops) == 1 and "Traceback" not in run.log, run.tail()
    # verl's own warning stays (docs/verl-integration.md): it ignores the key, the RPG trainer reads it
    assert any("max_num_gen_batches=2 is ignored by the built-in V1 ReplayBuffer" in line for line in lines)
    count = re.fullmatch(
        r"rpg: stopped at step 1: DAPO's dynamic sampling needed more than algorithm\.filter_groups\.max_num_gen_batches=2"
        r" generation batches of data\.train_batch_size=8 prompts to fill one training batch \((\d+) prompts refilled = "
        r"([\d.]+) x 8, and (\d+) more asked for\): its filter drops a group whose responses all have the same acc, .*",
        stops[0])
    assert count, stops[0]
    refilled, gen_batches, asked = int(count[1]), float(count[2]), int(count[3])
    assert refilled <= 2 * 8 < refilled + asked and 1 <= asked <= 8, stops[0]
    assert gen_batches == pytest.approx(refilled / 8, abs=1e-5), stops[0]
    assert "; Ray shut down; metrics log " in stops[0] and "resume: " in stops[0]
    assert not any("training/global_step" in m for m in run.metrics.values())  # no step trained
    assert not run.leftover_pids
