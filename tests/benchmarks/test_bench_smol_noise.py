"""benchmarks/bench_smol_base.py's evaluation noise (``--seeds``): its arithmetic and its argument check (no model;
the ``bench`` stage smoke-runs the benchmark itself, tests/e2e/test_smol_e2e.py)."""

import pytest

from benchmarks_module import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_smol_base")


def test_the_noise_is_the_evaluations_spread_and_the_binomial_standard_errors(bench):
    n = bench.noise([0.2, 0.25], 200)
    assert n["mean"] == pytest.approx(0.225) and n["largest_difference"] == pytest.approx(0.05)
    assert n["se_one"] == pytest.approx((0.225 * 0.775 / 200) ** 0.5)
    assert n["se_difference"] == pytest.approx(n["se_one"] * 2**0.5)
    assert bench.noise([0.0, 0.0, 0.0], 50)["se_one"] == 0.0  # every answer wrong: no spread to estimate


@pytest.mark.parametrize("seeds", ["0,0", "a", ""])
def test_bad_seeds_are_one_line_before_any_model(bench, seeds, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--seeds", seeds])
    assert e.value.code == 2 and "--seeds" in capsys.readouterr().err


@pytest.mark.parametrize("prefix", ["0", "a", "", "4,-1"])
def test_bad_prefix_counts_are_one_line_before_any_model(bench, prefix, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--prefix", prefix])
    assert e.value.code == 2 and "--prefix" in capsys.readouterr().err
