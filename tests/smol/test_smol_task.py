"""The SmolLM2 arithmetic task: splits, rows, the worked example, and the paper's reward on its answers."""

import pandas as pd
import pytest

from rpg.data.template import format_prompt, unwrap_prompt
from rpg.reward import compute_score
from rpg.smol import task


@pytest.fixture(scope="module")
def splits():
    return task.split(seed=11, n_train=250, n_val=200)


def test_the_splits_are_disjoint_in_their_arithmetic_and_deterministic_from_the_seed(splits):
    train, val = splits
    assert (len(train), len(val)) == (250, 200)
    keys = [p.key for p in train + val]
    assert len(set(keys)) == len(keys)  # no (operation, operands) twice, so none in both splits
    assert task.EXAMPLE.key not in keys  # nor the worked example's
    assert task.split(seed=11, n_train=250, n_val=200) == (train, val)
    other = task.split(seed=12, n_train=250, n_val=200)
    assert other != (train, val)


def test_the_runs_splits_hold_each_kind_by_its_share():
    """The default sizes fit the kinds' operands (the small ones have a few hundred pairs), and each split holds
    every kind in its share of ``MIX`` (largest remainder), validation like training."""
    train, val = task.split()
    assert (len(train), len(val)) == (task.N_TRAIN, task.N_VAL)
    assert len({p.key for p in train + val} | {task.EXAMPLE.key}) == task.N_TRAIN + task.N_VAL + 1
    for part in (train, val):
        counts = {k: sum(p.kind == k for p in part) for k in task.MIX}
        assert counts == task.quotas(len(part), task.MIX)
        total = sum(task.MIX.values())
        assert all(abs(counts[k] - len(part) * w / total) < 1 for k, w in task.MIX.items()), counts
    assert task.quotas(10, {"add": 1, "sub": 1, "mul": 1}) == {"add": 4, "sub": 3, "mul": 3}
    assert sum(task.quotas(7, task.MIX).values()) == 7


def test_commutative_operands_are_one_problem():
    assert task.Problem("add", 12, 3).key == task.Problem("word_add", 3, 12).key
    assert task.Problem("sub2", 34, 12).key != task.Problem("sub2", 12, 34).key
    assert task.Problem("mul", 12, 3).key == task.Problem("mul", 3, 12).key


def test_every_kind_of_the_mix_is_drawn_with_operands_in_its_ranges(splits):
    train, val = splits
    kinds = {p.kind for p in train + val}
    assert kinds == set(task.MIX)
    for p in train + val:
        op, (a_lo, a_hi), (b_lo, b_hi), _ = task.KINDS[p.kind]
        assert (a_lo <= p.a <= a_hi and b_lo <= p.b <= b_hi) or (
            op == "-" and a_lo <= p.b <= a_hi and b_lo <= p.a <= b_hi), p  # a subtraction's operands swapped
        assert p.answer >= 0
        assert p.answer == {"+": p.a + p.b, "-": p.a - p.b, "*": p.a * p.b}[op]


def test_a_bad_mix_is_refused():
    with pytest.raises(ValueError, match="mix"):
        task.split(mix={"div": 1})
    with pytest.raises(ValueError, match="mix"):
        task.split(mix={"add2": 0})
    with pytest.raises(ValueError, match="distinct problems .* 'mul' run out"):
        task.split(n_train=60, n_val=10, mix={"mul": 1})  # 2..12 x 2..9: 60 distinct products


def test_every_reference_answer_scores_plus_one_and_every_wrong_one_minus_one(splits):
    """By the paper's rule (``rpg.reward`` on ``math_dapo``), the last ``Answer:`` line; with verl's boxed fallback
    a boxed answer too."""
    train, val = splits
    for p in train[:100] + val[:100]:
        right, wrong = str(p.answer), str(p.answer + 1)
        assert compute_score(task.DATA_SOURCE, task.reference_response(p), right)["score"] == 1.0
        assert compute_score(task.DATA_SOURCE, f"Answer: {wrong}", right)["score"] == -1.0
        assert compute_score(task.DATA_SOURCE, f"Answer: {p.answer - 1}", right)["score"] == -1.0
        boxed = f"The answer is $\\boxed{{{right}}}$."
        assert compute_score(task.DATA_SOURCE, boxed, right, boxed_fallback=True)["score"] == 1.0
        assert compute_score(task.DATA_SOURCE, boxed.replace(right, wrong), right, boxed_fallback=True)["score"] \
            == -1.0


def test_rows_are_the_projects_layout_in_the_papers_template(splits, tmp_path):
    from rpg.data.io import write_parquet_atomic

    train, val = splits
    rows = task.rows(val, "test")
    write_parquet_atomic(rows, tmp_path / "val.parquet")
    df = pd.read_parquet(tmp_path / "val.parquet")
    assert len(df) == len(val) and set(df.data_source) == {"math_dapo"}
    for row, p in zip(df.itertuples(), val):
        example, answer, problem = row.prompt
        assert [dict(example), dict(answer)] == task.example_turns()
        assert (problem["role"], problem["content"]) == ("user", format_prompt(p.text()))
        assert unwrap_prompt(problem["content"]) == p.text()
        assert row.reward_model["ground_truth"] == str(p.answer) and row.extra_info["split"] == "test"


def test_the_worked_example_is_the_papers_template_and_format():
    """The example's user turn is the paper's template around a problem of the task; its assistant turn is an
    answer the paper's rule scores +1."""
    user, assistant = task.example_turns()
    assert (user["role"], assistant["role"]) == ("user", "assistant")
    assert unwrap_prompt(user["content"]) == task.EXAMPLE.text() == "What is $2 + 3$?"
    assert assistant["content"] == "2 + 3 = 5.\nAnswer: 5"
    assert compute_score(task.DATA_SOURCE, assistant["content"], str(task.EXAMPLE.answer))["score"] == 1.0


def test_the_data_gate_accepts_the_files(splits, tmp_path):
    """The files pass the checks the demo and the driver apply to a user's data (``rpg.data.checks``)."""
    from rpg.data.checks import file_problems, scorer_of
    from rpg.data.io import write_parquet_atomic
    from rpg.launch.experiments import recipe_value

    train, val = splits
    write_parquet_atomic(task.rows(train, "train"), tmp_path / "train.parquet")
    scorer = scorer_of(recipe_value)
    assert file_problems("data.train_files", str(tmp_path / "train.parquet"), scorer=scorer) == []
