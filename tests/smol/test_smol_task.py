"""The SmolLM2 arithmetic task: splits, rows, and the paper's reward on its answers."""

import pandas as pd
import pytest

from rpg.data.template import format_prompt, unwrap_prompt
from rpg.reward import compute_score
from rpg.smol import task


@pytest.fixture(scope="module")
def splits():
    return task.split(seed=11, n_train=1500, n_val=300)


def test_the_splits_are_disjoint_in_their_arithmetic_and_deterministic_from_the_seed(splits):
    train, val = splits
    assert (len(train), len(val)) == (1500, 300)
    keys = [p.key for p in train + val]
    assert len(set(keys)) == len(keys)  # no (operation, operands) twice, so none in both splits
    assert task.split(seed=11, n_train=1500, n_val=300) == (train, val)
    other = task.split(seed=12, n_train=1500, n_val=300)
    assert other != (train, val)


def test_commutative_operands_are_one_problem():
    assert task.Problem("add2", 12, 34).key == task.Problem("word_add", 34, 12).key
    assert task.Problem("sub2", 34, 12).key != task.Problem("sub2", 12, 34).key
    assert task.Problem("mul", 12, 3).key == task.Problem("word_mul", 3, 12).key


def test_every_kind_of_the_mix_is_drawn_with_operands_of_its_size(splits):
    train, val = splits
    kinds = {p.kind for p in train + val}
    assert kinds == set(task.MIX)
    for p in train + val:
        op, da, db, _ = task.KINDS[p.kind]
        digits = sorted([len(str(p.a)), len(str(p.b))])
        assert digits == sorted([da, db]) or (op == "-" and p.a >= p.b), p
        assert p.answer >= 0
        assert p.answer == {"+": p.a + p.b, "-": p.a - p.b, "*": p.a * p.b}[op]


def test_a_bad_mix_is_refused():
    with pytest.raises(ValueError, match="mix"):
        task.split(mix={"div": 1})
    with pytest.raises(ValueError, match="mix"):
        task.split(mix={"add2": 0})
    with pytest.raises(ValueError, match="distinct problems"):
        task.split(n_train=800, n_val=10, mix={"mul": 1})  # 90 x 8 products: 720 distinct


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
        content = row.prompt[0]["content"]
        assert content == format_prompt(p.text()) and unwrap_prompt(content) == p.text()
        assert row.reward_model["ground_truth"] == str(p.answer) and row.extra_info["split"] == "test"


def test_the_data_gate_accepts_the_files(splits, tmp_path):
    """The files pass the checks the demo and the driver apply to a user's data (``rpg.data.checks``)."""
    from rpg.data.checks import file_problems, scorer_of
    from rpg.data.io import write_parquet_atomic
    from rpg.launch.experiments import recipe_value

    train, val = splits
    write_parquet_atomic(task.rows(train, "train"), tmp_path / "train.parquet")
    scorer = scorer_of(recipe_value)
    assert file_problems("data.train_files", str(tmp_path / "train.parquet"), scorer=scorer) == []
