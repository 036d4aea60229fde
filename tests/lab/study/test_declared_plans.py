"""A declared study's PLAN.md cannot change silently after it is declared: git's history of the file is exactly the
commits its design names (``rpg_lab.study.plan_and_results.Design.plan_commits``: the declaration, then each change), every
change after the declaration is named in the study's DEVIATIONS.md, and the checkout's file is the last commit's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rpg_lab.study import lag, lag_addendum, smol, smol_loss, smol_paper
from rpg_lab.study.plan_and_results import Design

ROOT = Path(__file__).resolve().parents[3]
DESIGNS = {"lag": lag.DESIGN, "lag-addendum": lag_addendum.DESIGN, "smol": smol.PILOT.DESIGN,
           "smol-paper": smol_paper.PAPER.DESIGN, "smol-loss": smol_loss.LOSS.DESIGN}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout


def plan_problems(design: Design, root: Path) -> list[str]:
    """What is wrong with ``design``'s plan in the git checkout ``root``: one line each."""
    problems = []
    log = list(reversed(_git(root, "log", "--format=%H", "--follow", "--", design.plan).split()))
    if len(log) != len(design.plan_commits) or not all(
            full.startswith(short) for full, short in zip(log, design.plan_commits)):
        problems.append(f"{design.plan} was written by {[c[:7] for c in log]}, the design declares "
                        f"{list(design.plan_commits)}: a change after the declaration is a deviation (DEVIATIONS.md, "
                        "and the commit in plan_commits)")
    if _git(root, "status", "--porcelain", "--", design.plan):
        problems.append(f"{design.plan} has uncommitted changes")
    deviations = (root / design.plan).with_name("DEVIATIONS.md")
    text = deviations.read_text(encoding="utf-8") if deviations.is_file() else ""
    unnamed = [c for c in design.plan_commits[1:] if c not in text]
    if unnamed:
        problems.append(f"{design.plan}: changed by {unnamed}, which its DEVIATIONS.md does not name")
    return problems


@pytest.fixture(scope="module")
def history() -> None:
    try:
        shallow = _git(ROOT, "rev-parse", "--is-shallow-repository").strip()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: a plan's history cannot be read")
    if shallow == "true":
        pytest.skip("a shallow clone: a plan's history is cut off (git fetch --unshallow)")


@pytest.mark.parametrize("name", sorted(DESIGNS))
def test_the_plan_is_the_commits_that_declared_it(name, history):
    design = DESIGNS[name]
    assert design.plan_commits, f"{design.name}: no plan_commits declared"
    assert plan_problems(design, ROOT) == []


def test_a_change_after_the_declaration_is_caught(tmp_path):
    """The check on a scratch repository: a plan changed after its declaration fails it until the design names the
    change and DEVIATIONS.md does too; an uncommitted edit fails it."""
    repo = tmp_path / "r"
    (repo / "s").mkdir(parents=True)
    _git(repo, "init", "-q")
    plan = repo / "s" / "PLAN.md"
    plan.write_text("declared\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "declare")
    first = _git(repo, "rev-parse", "--short=7", "HEAD").strip()

    def design(*commits: str) -> Design:
        return Design("s", "--s", "s/PLAN.md", (), (), 1, ("c",), commits)

    assert plan_problems(design(first), repo) == []
    plan.write_text("declared, then changed\n")
    assert plan_problems(design(first), repo) == ["s/PLAN.md has uncommitted changes"]
    _git(repo, "commit", "-q", "-am", "change")
    second = _git(repo, "rev-parse", "--short=7", "HEAD").strip()
    assert "a change after the declaration is a deviation" in plan_problems(design(first), repo)[0]
    assert plan_problems(design(first, second), repo) == [
        f"s/PLAN.md: changed by ['{second}'], which its DEVIATIONS.md does not name"]
    (repo / "s" / "DEVIATIONS.md").write_text(f"changed in {second}\n")
    assert plan_problems(design(first, second), repo) == []
