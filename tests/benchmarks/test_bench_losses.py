"""Smoke runs of benchmarks/bench_losses.py (the ``bench`` CI stage) at a tiny size, one pass each: the default
table (the four core losses, eager, through verl's glue and compiled) and every variant (eager), each row
with its ratios against verl's vanilla loss."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from messages import names

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^(verl vanilla|rpg) .*?\s+(\d+|-)\s+([\d.]+|-)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")


def _rows(args: list[str]) -> dict[str, list[str]]:
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_losses.py"), "--batch", "2", "--length", "64",
                        "--reps", "1", *args], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    names(p.stdout.splitlines()[0], "2 x 64 tokens", "float32", "1 thread", "thread CPU time", "median of 1 ")
    return {line[:62].strip(): line[62:].split() for line in p.stdout.splitlines() if ROW.match(line)}


@pytest.mark.bench
def test_the_loss_benchmark_prints_every_row_with_its_ratios():
    rows = _rows([])
    assert len(rows) == 1 + 4 + 1 + 4  # vanilla, the core losses, one through verl's glue, the core compiled
    assert rows["verl vanilla (dual-clip PPO)"][1] == "1.00"  # ratios against itself
    assert sum(name.endswith("[compiled]") for name in rows) == 4
    assert all(float(cells[3]) > 0 for cells in rows.values())  # time ratio
    rows = _rows(["--variants", "all", "--no-compiled"])
    assert len(rows) == 1 + 32 + 4 + 2 + 1 and not any(name.endswith("[compiled]") for name in rows)


@pytest.mark.bench
def test_the_loss_benchmark_times_a_baseline_checkout_in_the_same_passes():
    """``--baseline DIR`` (here this tree against itself): a second table with each eager RPG row's operators and
    time before and after, their ratio and its geometric mean."""
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_losses.py"), "--batch", "2", "--length", "64",
                        "--reps", "1", "--no-compiled", "--baseline", str(ROOT)], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    table = p.stdout.split(f"against --baseline {ROOT}, timed in the same passes")[1].splitlines()[2:]
    rows = [line for line in table if line.startswith("rpg ")]
    assert len(rows) == 4 and all(line.split()[-5] == line.split()[-4] for line in rows)  # the same operators
    assert all(float(line.split()[-1]) > 0 for line in rows)
    assert table[len(rows)].startswith("geometric mean") and float(table[len(rows)].split()[-1]) > 0
