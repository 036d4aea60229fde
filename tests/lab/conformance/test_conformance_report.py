"""The KL-gradient conformance report (docs/conformance.md): the committed report is its committed CSV rendered, every
row names its version and code path, and the harness gives the known answers (exact identities of docs/math.md).
Every framework's rows are computed again and compared with the CSV by the ``conformance`` stage
(test_conformance_frameworks.py)."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rpg_lab.conformance import catalogue, report, scoring, table
from rpg_lab.conformance.__main__ import paths
from rpg_lab.conformance.probes import rpg_kl, verl_kl
from rpg_lab.conformance.scenarios import ON_POLICY, scenarios

ROOT = Path(__file__).resolve().parents[3]
CSV, MARKDOWN, FIGURE = paths(ROOT / "docs")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a loaded machine's thread pool costs 100 times the work
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def committed():
    return table.read_csv(CSV)


@pytest.fixture(scope="module")
def grid():
    scns = scenarios()
    return scns, [scoring.target_gradients(s) for s in scns]


def _scores(module, key, form, scns, targets):
    """(scenario, distances, matched at float64) of one setting on every scenario."""
    out = module.compute([s.batch([key]) for s in scns])
    return [(s, d, scoring.matches(d, 1e-10)) for s, t, tg in zip(scns, out, targets)
            for d in [scoring.distances(scoring.expected_gradient(s, t[key], form), tg)]]


def test_the_committed_report_is_its_csv_rendered(committed, tmp_path):
    assert MARKDOWN.read_text() == report.render_markdown(committed), \
        "docs/conformance.md differs from its CSV rendered: python -m rpg_lab.conformance --render-only"
    assert FIGURE.is_file()
    report.render_figure(committed, tmp_path / "figure.png")
    assert (tmp_path / "figure.png").stat().st_size > 10_000


def test_every_row_names_its_version_and_code_path_and_every_setting_is_there(committed):
    for row in committed:
        assert row["version"] == catalogue.FRAMEWORKS[row["framework"]].version, row
        assert row["call"] and row["status"], row
    assert {(r["framework"], r["setting"]) for r in committed} == {(s.framework, s.key) for s in catalogue.SETTINGS}
    assert all(r["status"] == table.SCORED for r in committed if r["setting"] not in ("loss:full", "reward:full"))


def test_every_setting_is_one_its_probe_computes():
    import importlib

    for name, fw in catalogue.FRAMEWORKS.items():
        probe = importlib.import_module(f"rpg_lab.conformance.probes.{fw.probe}")
        assert {s.key for s in catalogue.SETTINGS if s.framework == name} == set(probe.SETTINGS), name


def test_the_samplers_are_at_their_distances(grid):
    scns, _ = grid
    for scn in scns:
        assert scn.kl_mu_pi() == pytest.approx(scn.distance, rel=1e-9, abs=1e-15)
        assert scn.mu.sum() == pytest.approx(1.0, abs=1e-12)


def test_k3_with_its_exact_weight_is_the_reverse_kl_gradient_and_without_it_is_not(grid):
    """T13/T14: RPG's w·k3 gives ∇KL(πθ‖π_ref) at every sampler, one token; verl's k3 without the weight is the
    forward KL's on-policy (T18) and no divergence's off-policy (T15): the harness tells them apart."""
    scns, targets = [[x for x, s in zip(v, grid[0]) if s.space.T == 1] for v in grid]
    for scn, d, m in _scores(rpg_kl, "grpo_corrected", "loss", scns, targets):
        assert m == "rkl urkl" and d["rel_err_rkl"] < 1e-12, (scn.distance, d)
    for scn, d, m in _scores(verl_kl, "loss:low_var_kl", "loss", scns, targets):
        assert m == ("fkl ufkl" if scn.distance == ON_POLICY else "none"), (scn.distance, d)
        if scn.distance != ON_POLICY:
            assert d["rel_err_rkl"] > 0.1 and d["rel_err_fkl"] > 0.1


def test_on_policy_k1_as_a_loss_has_zero_expected_gradient_and_k1_in_the_reward_the_reverse_kls(grid):
    """T18: E_πθ[∇(l − l_ref)] = E_πθ[∇l] = 0 at every length; the reward's k1 is the score-function form of the
    reverse KL's gradient, over whole sequences too."""
    scns, targets = [[x for x, s in zip(v, grid[0]) if s.distance == ON_POLICY] for v in grid]
    for scn, d, m in _scores(verl_kl, "loss:kl", "loss", scns, targets):
        assert m == "zero" and d["grad_norm"] < 1e-14 * d["target_norm"], (scn.space.T, d)
    for scn, d, m in _scores(verl_kl, "reward:kl", "reward", scns, targets):
        assert m == "rkl urkl" and d["rel_err_rkl"] < 1e-12, (scn.space.T, d)


def test_rpg_losses_are_exact_within_1e_12_with_one_token(grid):
    """T6, T9 with three policies (T5b): each of RPG's eight losses has the exact gradient of its own divergence at
    every sampler."""
    scns, targets = [[x for x, s in zip(v, grid[0]) if s.space.T == 1] for v in grid]
    for form in rpg_kl.FORMS:
        for div in rpg_kl.DIVERGENCES:
            for scn, d, m in _scores(rpg_kl, f"{form}:{div}", "loss", scns, targets):
                assert d[f"rel_err_{div}"] < 1e-12 and div in m.split(), (form, div, scn.distance, d)


def test_over_sequences_the_forward_token_sum_is_exact_with_the_anchor_at_the_sampler_and_the_reverse_is_not(grid):
    """T26 and T27 over whole sequences (T = 2, 3), the harness's known answer there: with π_ref = μ, RPG's forward
    losses (k3 summed over tokens) have the sequence-level forward KL's gradient at every off-policy sampler; the
    reverse one (per-token weights, no prefix weights) has no divergence's."""
    scns = [replace(s, z_ref=s.z_mu) for s in grid[0] if s.space.T > 1 and s.distance != ON_POLICY]
    targets = [scoring.target_gradients(s) for s in scns]
    for key in ("differentiable:ufkl", "reinforce:fkl"):
        for scn, d, m in _scores(rpg_kl, key, "loss", scns, targets):
            assert "fkl" in m.split() and d["rel_err_fkl"] < 1e-12, (key, scn.space.T, scn.distance, d)
    for scn, d, m in _scores(rpg_kl, "differentiable:urkl", "loss", scns, targets):
        assert m == "none" and d["rel_err_rkl"] > 1e-3, (scn.space.T, scn.distance, d)


SCIENTIFIC = re.compile(r"\d(?:\.\d+)?e[-+]?\d+")  # a relative error as the report prints it (``{:.0e}``)


def assert_same_report(fresh: str, old: str) -> None:
    """The same report but for errors both at or below 1e-4, precision's noise, which the CPU's kernels move (an AVX2
    and an AVX-512 machine print 3e-16 and 2e-16 for one error), as ``assert_same_rows`` compares the CSV's."""
    assert SCIENTIFIC.sub("<e>", fresh) == SCIENTIFIC.sub("<e>", old)
    for a, b in zip(SCIENTIFIC.findall(fresh), SCIENTIFIC.findall(old)):
        assert a == b or max(float(a), float(b)) <= 1e-4, (a, b)


def assert_same_rows(fresh: list[dict], old: list[dict]) -> None:
    """The same settings, statuses and matches; every error and cosine equal to 1e-6 where it is above 1e-4 (below,
    precision's noise: both below it)."""
    key = ("framework", "setting", "T", "V", "kl_mu_pi")
    assert [tuple(r[k] for k in key) for r in fresh] == [tuple(r[k] for k in key) for r in old]
    for new, was in zip(fresh, old):
        assert (new["status"], new["matches"], new["version"]) == (was["status"], was["matches"], was["version"]), new
        for column in table.COLUMNS:
            if column.startswith(("rel_err", "cos")) and new[column] != "":
                a, b = float(new[column]), float(was[column])
                if math.isnan(a) or math.isnan(b):
                    assert math.isnan(a) and math.isnan(b), (column, new, was)
                elif max(abs(a), abs(b)) > 1e-4:
                    assert a == pytest.approx(b, rel=1e-6), (column, new, was)
                else:
                    assert max(abs(a), abs(b)) <= 1e-4, (column, new, was)


def test_a_framework_whose_environment_is_missing_is_a_row_that_says_why(grid, tmp_path):
    rows = table.framework_rows("TRL", *grid, envs=tmp_path / "none")
    assert [r["setting"] for r in rows] == [s.key for s in catalogue.SETTINGS if s.framework == "TRL"]
    assert all(r["status"].startswith(f"not run: {tmp_path / 'none' / 'trl'} is not set up: run `bash lab/scripts/"
                                      "setup_conformance.sh") for r in rows), rows[0]["status"]


def test_the_command_refuses_bad_input_in_one_line(tmp_path, capsys):
    from rpg_lab.conformance.__main__ import main

    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--render-only"])
    assert f"--render-only: {tmp_path / 'conformance' / 'conformance.csv'} does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--frameworks", "RPG,Nope"])
    assert "--frameworks: Nope unknown; choose among RPG, verl, TRL" in capsys.readouterr().err


def test_one_frameworks_rows_replace_its_own_and_keep_the_others(committed, tmp_path):
    """``--frameworks RPG`` computes RPG's rows again and keeps every other framework's row of the CSV there."""
    from rpg_lab.conformance.__main__ import main

    csv_path, md_path, _ = paths(tmp_path)
    csv_path.parent.mkdir(parents=True)
    others = [r for r in committed if r["framework"] != "RPG"]
    table.write_csv(others, csv_path)  # the RPG rows missing: the command puts them back, first
    assert main(["--out", str(tmp_path), "--frameworks", "RPG"]) == 0
    assert_same_rows(table.read_csv(csv_path), committed)  # NaN cosines: not compared by ==
    assert_same_report(md_path.read_text(), MARKDOWN.read_text())


def test_the_reports_comparison_can_fail():
    same = "| = FKL (3e-16) | 0.12 (cos 0.98) | = RKL (2e-03) |"
    assert_same_report(same, same.replace("3e-16", "5e-16"))  # both at float64's roundoff: the CPU's kernels
    for other in (same.replace("2e-03", "3e-03"), same.replace("FKL", "RKL"), same.replace("0.98", "0.97"),
                  same.replace("3e-16", "2e-03")):
        with pytest.raises(AssertionError):
            assert_same_report(same, other)
