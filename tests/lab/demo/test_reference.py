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
A, B = "CPU A (avx512)", "CPU B (avx512)"  # cpu_key of HERE, and of another CPU


def _reference(observed=OBSERVED, *cpus, **others):
    """A reference made on ``cpus`` (default HERE's) computing ``observed``, and on ``others`` (a key's dict) theirs."""
    made = {key: {**copy.deepcopy(observed), "made": {"kernels": {}}} for key in (cpus or (A,))}
    made.update({key: {**copy.deepcopy(value), "made": {"kernels": {}}} for key, value in others.items()})
    return {"cpus": made, "command": ["x"], "env": {}}


def test_the_same_bits_pass_and_metadata_is_not_compared():
    assert R.differences(OBSERVED, _reference()["cpus"][A]) == []  # NaN equals NaN; made is not computation
    ok, line = R.verdict(copy.deepcopy(OBSERVED), _reference(), HERE)
    assert ok and "last bit on this CPU (CPU A (avx512)" in line
    assert R.cpu_key(HERE) == A


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


def test_each_cpu_is_held_to_its_own_bits():
    """Two CPUs' references (their last digits differ): each CPU's run to the bit of its own, not the other's."""
    on_b = copy.deepcopy(OBSERVED)
    on_b["metrics"]["1"]["actor/grad_norm"] *= 1 + 1e-7
    reference = _reference(OBSERVED, **{B: on_b})
    assert R.verdict(copy.deepcopy(OBSERVED), reference, HERE)[0]
    assert R.verdict(copy.deepcopy(on_b), reference, {**HERE, "cpu": "CPU B"})[0]
    ok, line = R.verdict(copy.deepcopy(on_b), reference, HERE)  # B's bits on A: A's reference moved
    assert not ok and "moved (1 differences): metrics 1 actor/grad_norm" in line, line
    assert not R.verdict(copy.deepcopy(OBSERVED), reference, {**HERE, "cpu": "CPU B"})[0]


def test_on_a_cpu_never_made_on_no_check_passes_and_the_line_says_whether_the_computation_moved():
    """Other last bits there are this CPU's own (the command that adds them is named); other responses or weights
    are a changed computation on any CPU (the decision's wording)."""
    observed = copy.deepcopy(OBSERVED)
    observed["metrics"]["1"]["actor/grad_norm"] *= 1 + 1e-7
    ok, line = R.verdict(observed, _reference(OBSERVED, B), HERE)
    assert not ok and "\n" not in line and f"never made on this CPU ({A}; made on {B})" in line, line
    assert f"read and sampled what {B}'s did" in line and "--regenerate --model tiny --reason TEXT adds" in line
    for change, named in ((lambda o: o["val_before"].update({"sha256": "e" * 64}), "val_before sha256 eeeeeeeeeeee"),
                          (lambda o: o.update({"weights_sha256": "d" * 64}), "weights_sha256 dddddddddddd")):
        moved = copy.deepcopy(observed)
        change(moved)
        ok, line = R.verdict(moved, _reference(OBSERVED, B), HERE)
        assert not ok and "moved (1 differences)" in line and named in line and "records it" in line, line
    ok, line = R.verdict(observed, {"cpus": {}}, HERE)
    assert not ok and "no CPU's reference yet" in line


def test_regenerate_writes_this_cpus_keeps_the_others_and_names_those_that_now_disagree(tmp_path, monkeypatch):
    rows = []
    monkeypatch.setattr(R, "REFERENCES", tmp_path)
    monkeypatch.setattr(R.run_record, "log_change", lambda *a: rows.append(a))
    ran_on = {"kernels": HERE, "libraries": {"torch": "x"}}
    R.reference_file("tiny").write_text(json.dumps(_reference(OBSERVED, B)))
    path, apart = R.regenerate(copy.deepcopy(OBSERVED), "this CPU's bits", ran_on)
    written = json.loads(path.read_text())
    assert sorted(written["cpus"]) == [A, B] and apart == []
    assert R.differences(OBSERVED, written["cpus"][A]) == [] and written["cpus"][A]["made"]["kernels"] == HERE
    assert written["env"] == R.PINNED_ENV and rows[-1][0] == f"tiny reference on {A}" and rows[-1][1] is None
    last_bits = copy.deepcopy(OBSERVED)
    last_bits["metrics"]["1"]["actor/loss"] = -0.15  # other numbers only: B's is not named
    assert R.regenerate(last_bits, "again", ran_on)[1] == []
    changed = copy.deepcopy(OBSERVED)
    changed["val_before"]["sha256"] = "f" * 64  # other responses: a computation changed on purpose, B's is apart
    _, apart = R.regenerate(changed, "the sampler changed", ran_on)
    assert apart == [B] and rows[-1][1] is not None and rows[-1][1] != rows[-1][2]
    kept = json.loads(path.read_text())["cpus"][B]  # kept, not dropped
    assert R.differences(kept, _reference(OBSERVED, B)["cpus"][B]) == [] and kept["made"] == {"kernels": {}}


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

    for model in R.MODELS:
        reference = json.loads(R.reference_file(model).read_text())
        assert reference["env"] == R.PINNED_ENV and reference["cpus"], model
        for key, entry in reference["cpus"].items():
            assert R.cpu_key(entry["made"]["kernels"]) == key and entry["made"]["kernels"]["capability"] == "AVX2"
            if model == "tiny":
                assert entry["weights_sha256"] == weights_sha256()
                assert sorted(entry["metrics"], key=int) == [str(s) for s in range(R.STEPS + 1)]


def test_a_reference_without_each_cpus_bits_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(R, "REFERENCES", tmp_path)
    R.reference_file("tiny").write_text(json.dumps({**OBSERVED, "made": {"kernels": HERE}}))
    with pytest.raises(SystemExit) as e:
        R.main(["--check"])
    assert e.value.code == 2 and "without each CPU's bits ('cpus')" in capsys.readouterr().err


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
