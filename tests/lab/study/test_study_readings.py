"""docs/study.md's Readings quote what the code computes from the committed runs.csv: for each declared study, the
table of its hypotheses (effect [95 % interval], p, Holm p, verdict) in its section agrees, to the digits printed,
with ``study.tested(rows)`` (what results.md prints), and no Reading table exists while a run of the plan is
unfinished (the plans read no result before all of their runs finish)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from reading_rows import ROW, SEEDS_ROW, agrees

from rpg_lab.study.lag import ALPHA, LAG
from rpg_lab.study.lag_addendum import ADDENDUM
from rpg_lab.study.smol_loss import LOSS
from rpg_lab.study.smol_paper import PAPER

ROOT = Path(__file__).resolve().parents[3]
STUDY_MD = ROOT / "docs" / "study.md"

# the section of docs/study.md that reads the study, its study object and its committed runs.csv
READINGS = {
    "## The lag study": (LAG, "docs/study/lag/runs.csv"),
    "## The lag addendum": (ADDENDUM, "docs/study/lag-addendum/runs.csv"),
    "## The paper's comparison on SmolLM2": (PAPER, "docs/study/smol-paper/runs.csv"),
    "## The loss comparison on SmolLM2": (LOSS, "docs/study/smol-loss/runs.csv"),
}


def section(text: str, heading: str) -> str:
    """The text of the section whose heading starts with ``heading``, up to the next heading of its level or above."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    level = len(heading) - len(heading.lstrip("#"))
    end = next((i for i in range(start + 1, len(lines))
                if re.match(rf"^#{{1,{level}}} ", lines[i])), len(lines))
    return "\n".join(lines[start:end])


def reading_rows(heading: str) -> list[re.Match]:
    return [m for line in section(STUDY_MD.read_text(encoding="utf-8"), heading).splitlines()
            if (m := ROW.match(line))]


@pytest.mark.parametrize("heading", list(READINGS))
def test_a_reading_quotes_the_codes_numbers_from_the_committed_csv(heading):
    study, csv_name = READINGS[heading]
    csv_path = ROOT / csv_name
    rows = study.read_csv(csv_path) if csv_path.is_file() else []
    quoted = reading_rows(heading)
    if not rows or any(r["status"] != "done" for r in rows):
        assert quoted == [], f"{heading}: a Reading table while {csv_name} has unfinished runs"
        pytest.skip(f"{csv_name}: the plan's runs have not all finished; its Reading has no table yet")
    tested = {t.result.contrast.name: t for t in study.tested(rows)}
    assert [m["name"] for m in quoted] == list(tested), (heading, [m.group(0) for m in quoted])
    for m in quoted:
        t = tested[m["name"]]
        lo, hi = t.result.ci
        assert t.level == 0.95, (m["name"], t.level)
        for key, value in (("mean", t.result.mean), ("lo", lo), ("hi", hi), ("p", t.p), ("holm", t.holm)):
            assert agrees(m[key], value), (heading, m["name"], key, m[key], value)
        assert m["verdict"].strip() == ("supported" if t.holm <= ALPHA else "not supported"), m.group(0)


def test_the_readings_check_is_one_that_can_fail():
    """The comparison above rejects a number off by one in its last digit and a verdict the Holm p contradicts."""
    assert agrees("0.205", 0.2054) and not agrees("0.205", 0.2056) and not agrees("0.206", 0.2054)
    assert agrees("2.4e-4", 0.000244) and not agrees("2.4e-4", 0.000246)
    lag_rows = reading_rows("## The lag study")
    assert len(lag_rows) == len(LAG.hypotheses)  # the committed lag study's Reading is checked, not skipped
    line = lag_rows[0].group(0)
    assert ROW.match(line.replace("| 0.017 |", "| 0.018 |"))["holm"] == "0.018"


def test_the_paper_comparison_without_the_pilots_seeds_is_the_codes():
    """The Reading's seeds 4-12 table (H1-H4 on the seeds the pilot did not run) agrees with
    ``rpg_lab.study.smol_paper.without_pilot_seeds`` on the committed runs.csv, to the digits printed."""
    from rpg_lab.study.smol_paper import without_pilot_seeds

    text = section(STUDY_MD.read_text(encoding="utf-8"), "## The paper's comparison on SmolLM2")
    quoted = [m for line in text.splitlines() if (m := SEEDS_ROW.match(line))]
    tested = without_pilot_seeds(PAPER.read_csv(ROOT / "docs/study/smol-paper/runs.csv"))
    assert [m["name"] for m in quoted] == [t.result.contrast.name for t in tested]
    for m, t in zip(quoted, tested):
        lo, hi = t.result.ci
        assert (int(m["n"]), int(m["up"])) == (len(t.result.d), sum(x > 0 for x in t.result.d)), m.group(0)
        assert t.result.seeds == tuple(range(4, 13)) and t.level == 0.95
        for key, value in (("mean", t.result.mean), ("lo", lo), ("hi", hi), ("p", t.p), ("holm", t.holm)):
            assert agrees(m[key], value), (m["name"], key, m[key], value)


def test_the_loss_comparison_without_the_seeds_of_two_kernels_is_the_codes():
    """The loss comparison's sensitivity table (the declared families without the seeds whose arms ran on two kinds
    of CPU kernels, DEVIATIONS.md section 4) agrees with ``rpg_lab.study.smol_loss.without_mixed_kernels`` on the
    committed runs.csv, to the digits printed; no such table while a run of the plan is unfinished."""
    from rpg_lab.study.smol_loss import without_mixed_kernels

    text = section(STUDY_MD.read_text(encoding="utf-8"), "## The loss comparison on SmolLM2")
    quoted = [m for line in text.splitlines() if (m := SEEDS_ROW.match(line))]
    rows = LOSS.read_csv(ROOT / "docs/study/smol-loss/runs.csv")
    if any(r["status"] != "done" for r in rows):
        assert quoted == [], [m.group(0) for m in quoted]
        pytest.skip("docs/study/smol-loss/runs.csv: the plan's runs have not all finished; no sensitivity table yet")
    left_out, tested = without_mixed_kernels(rows)
    assert left_out == (104, 107) and [m["name"] for m in quoted] == [t.result.contrast.name for t in tested]
    for m, t in zip(quoted, tested):
        lo, hi = t.result.ci
        assert (int(m["n"]), int(m["up"])) == (len(t.result.d), sum(x > 0 for x in t.result.d)), m.group(0)
        assert not set(left_out) & set(t.result.seeds) and t.level == 0.95
        for key, value in (("mean", t.result.mean), ("lo", lo), ("hi", hi), ("p", t.p), ("holm", t.holm)):
            assert agrees(m[key], value), (m["name"], key, m[key], value)
