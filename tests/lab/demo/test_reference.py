"""The references' comparison (``rpg_lab.demo.reference``): what a run computed against the committed reference, to the
bit, one line naming what moved; the runs themselves are in the repro stage (tiny) and the smol stage (SmolLM2)."""

from __future__ import annotations

import copy
import json
import math

import pytest

from rpg_lab.demo import reference as R

OBSERVED = {"weights_sha256": "a" * 64,
            "val_before": {"samples": 120, "accuracy": 0.3, "sha256": "b" * 64},
            "metrics": {"0": {"val-core/acc": 0.3}, "1": {"actor/grad_norm": 1.0280458629131317, "actor/loss": -0.14,
                                                         "training/rpg/batch_digest": 123456.0, "nan": float("nan")},
                        "10": {"actor/grad_norm": 0.5}}}
HERE = {"cpu": "CPU A", "isa": "avx512", "capability": "DEFAULT"}


def _reference(observed=OBSERVED, cpu="CPU A"):
    return {**copy.deepcopy(observed), "made": {"kernels": {"cpu": cpu, "isa": "avx512"}}, "command": ["x"],
            "env": {}}


def test_the_same_bits_pass_and_metadata_is_not_compared():
    assert R.differences(OBSERVED, _reference()) == []  # NaN equals NaN; made/command/env are not computation
    ok, line = R.verdict(copy.deepcopy(OBSERVED), _reference(), HERE)
    assert ok and "last bit" in line


@pytest.mark.parametrize("change, named", [
    (lambda o: o["metrics"]["1"].update({"actor/grad_norm": math.nextafter(1.0280458629131317, 2)}),  # one bit
     "metrics 1 actor/grad_norm"),
    (lambda o: o["metrics"]["1"].update({"training/rpg/batch_digest": 654321.0}), "batch_digest"),
    (lambda o: o["val_before"].update({"sha256": "c" * 64}), "val_before sha256 cccccccccccc"),
    (lambda o: o.update({"weights_sha256": "d" * 64}), "weights_sha256 dddddddddddd (reference aaaaaaaaaaaa)"),
    (lambda o: o["metrics"].pop("10"), "metrics 10 missing"),
    (lambda o: o["metrics"]["1"].update({"new/metric": 1.0}), "new/metric not in the reference"),
])
def test_one_moved_bit_fails_in_one_line_naming_it_and_the_command(change, named):
    observed = copy.deepcopy(OBSERVED)
    change(observed)
    ok, line = R.verdict(observed, _reference(), HERE)
    assert not ok and "\n" not in line and named in line
    assert "python -m rpg_lab.demo.reference --regenerate --model tiny --reason" in line


def test_another_cpu_may_differ_in_the_last_digits_only_and_says_so():
    observed = copy.deepcopy(OBSERVED)
    observed["metrics"]["1"]["actor/grad_norm"] *= 1 + 1e-7
    ok, line = R.verdict(observed, _reference(cpu="CPU B"), HERE)
    assert ok and "within" in line and "CPU B" in line
    assert R.verdict(observed, _reference(), {**HERE, "isa": "avx2"})[0]  # one model name, another instruction set
    assert not R.verdict(observed, _reference(cpu="CPU A"), HERE)[0]  # on the reference's own CPU: the bits
    observed["metrics"]["1"]["actor/grad_norm"] *= 1.01  # beyond the last digits: fails on any CPU
    assert not R.verdict(observed, _reference(cpu="CPU B"), HERE)[0]
    moved_tokens = copy.deepcopy(OBSERVED)
    moved_tokens["val_before"]["sha256"] = "e" * 64  # a digest is never "close"
    assert not R.verdict(moved_tokens, _reference(cpu="CPU B"), HERE)[0]


def test_the_validation_responses_digest_ignores_order_and_verls_random_ids(tmp_path):
    rows = [{"input": "q1", "output": "Answer: 3", "score": 1.0, "uid": "x1"},
            {"input": "q2", "output": "2 + 2 = 4", "score": -1.0, "uid": "x2"}]
    (tmp_path / R.VAL_DIR).mkdir()
    (tmp_path / R.VAL_DIR / "0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = R.validation_responses(tmp_path)
    assert first["samples"] == 2 and first["accuracy"] == 0.5
    rows = [{**r, "uid": "y"} for r in reversed(rows)]
    (tmp_path / R.VAL_DIR / "0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert R.validation_responses(tmp_path) == first
    rows[0]["output"] = "2 + 2 = 5"
    (tmp_path / R.VAL_DIR / "0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert R.validation_responses(tmp_path)["sha256"] != first["sha256"]


def test_the_committed_references_are_of_the_shipped_weights_and_name_how_they_were_made():
    from rpg.tiny.build import weights_sha256

    tiny = json.loads(R.reference_file("tiny").read_text())
    assert tiny["weights_sha256"] == weights_sha256()
    assert tiny["env"] == R.PINNED_ENV and tiny["made"]["kernels"]["capability"] == "AVX2"
    assert sorted(tiny["metrics"], key=int) == [str(s) for s in range(R.STEPS + 1)]
    smol = json.loads(R.reference_file("smol").read_text())
    assert smol["env"] == R.PINNED_ENV and smol["made"]["kernels"]["capability"] == "AVX2"


def test_regenerate_refuses_without_a_reason():
    with pytest.raises(SystemExit) as e:
        R.main(["--regenerate"])
    assert e.value.code == 2


def test_the_pinned_environment_sets_every_variable_that_chooses_a_kernel_path():
    """A user's own value of any of them would reach the reference run otherwise (measured:
    ``MKL_ENABLE_INSTRUCTIONS=AVX512`` moved SmolLM2's first step in its last bits beside ``MKL_CBWR=AVX2``)."""
    from rpg.run_record import KERNEL_ENV

    assert set(KERNEL_ENV) <= set(R.PINNED_ENV)
    env = R.pinned_env({k: "something else" for k in KERNEL_ENV})
    assert {k: env[k] for k in R.PINNED_ENV} == R.PINNED_ENV
