"""The tests' layout (docs/testing.md#layout): every test file sits in a folder named for an ``rpg`` package, in
``tests/lab/<package>/`` for a package of the lab (``rpg_lab``), or in one of the few folders beside them; helper
modules only in ``tests/support/``; test file names unique across folders (conftest puts every test folder on the
path, so a module name says which file it is)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
# the folders beside the packages' own, each with what it holds (docs/testing.md#layout)
OTHER_FOLDERS = {
    "e2e": "files built around verl's trainer launches",
    "benchmarks": "the smoke tests of benchmarks/",
    "project": "checks of the project as a whole",
    "gpu": "the tests a GPU node runs (the GPU kit runs this folder)",
    "support": "helpers, no tests",
}
LAB = "lab"  # tests/lab/<package>/: the tests of lab/rpg_lab/<package>/
# helper modules outside support/, each with why: the GPU kit runs tests/gpu as a unit, its rank scripts with it
HELPERS_ELSEWHERE = {
    "tests/conftest.py": "pytest's shared fixtures and stages for the whole tree",
    "tests/gpu/reference_offload_ranks.py": "a rank script of tests/gpu (the GPU kit runs that folder)",
    "tests/gpu/schedulefree_offload_ranks.py": "a rank script of tests/gpu (the GPU kit runs that folder)",
}


def _packages(root: Path = ROOT, package: str = "rpg") -> set[str]:
    return {p.parent.name for p in (root / package).glob("*/__init__.py")}


def _lab_packages(root: Path = ROOT) -> set[str]:
    return _packages(root / "lab", "rpg_lab")


def _placed(parts: tuple[str, ...], packages: set[str], lab_packages: set[str]) -> bool:
    if parts[0] == LAB:
        return len(parts) == 3 and parts[1] in lab_packages
    return len(parts) == 2 and (parts[0] in packages or parts[0] in OTHER_FOLDERS)


def layout_problems(tests: Path, packages: set[str], lab_packages: set[str] = frozenset()) -> list[str]:
    problems = []
    files = sorted(p for p in tests.rglob("*.py") if "__pycache__" not in p.parts)
    for path in files:
        rel = path.relative_to(tests.parent).as_posix()
        parts = path.relative_to(tests).parts
        if path.name == "__init__.py":
            problems.append(f"{rel}: no __init__.py under tests/ (test folders are not packages: pyproject's "
                            "--import-mode=importlib)")
        elif path.name.startswith("test_"):
            if not _placed(parts, packages, lab_packages):
                problems.append(f"{rel}: a test file belongs in tests/<rpg package>/, tests/{LAB}/<rpg_lab package>/ "
                                f"or tests/{{{','.join(sorted(OTHER_FOLDERS))}}}/")
            elif parts[0] == "support":
                problems.append(f"{rel}: tests/support/ holds helpers, not tests")
        elif parts[0] != "support" and rel not in HELPERS_ELSEWHERE:
            problems.append(f"{rel}: a helper module belongs in tests/support/")
    names = Counter(p.name for p in files if p.name.startswith("test_"))
    problems += [f"{name}: {n} test files of this name (names are unique across tests/ folders)"
                 for name, n in sorted(names.items()) if n > 1]
    return problems


def test_the_tests_mirror_the_package_and_helpers_are_in_support():
    assert layout_problems(TESTS, _packages(), _lab_packages()) == []
    # every folder named for a package is one (a package renamed leaves no orphan folder), the lab's too
    orphans = sorted(d.name for d in TESTS.iterdir() if d.is_dir() and d.name != "__pycache__"
                     and d.name not in _packages() and d.name not in OTHER_FOLDERS and d.name != LAB)
    lab_orphans = sorted(d.name for d in (TESTS / LAB).iterdir() if d.is_dir() and d.name != "__pycache__"
                         and d.name not in _lab_packages())
    assert (orphans, lab_orphans) == ([], [])


def test_the_check_sees_each_kind_of_misplaced_file(tmp_path):
    tests = tmp_path / "tests"
    planted = ["test_flat.py", "math/test_ok.py", "nowhere/test_lost.py", "math/helper.py", "support/test_x.py",
               "support/ok_helper.py", "e2e/test_ok.py", "verl/test_ok.py", "math/__init__.py",
               "lab/conformance/test_lab_ok.py", "lab/test_lab_flat.py", "lab/nowhere/test_lab_lost.py"]
    for name in planted:
        (tests / name).parent.mkdir(parents=True, exist_ok=True)
        (tests / name).write_text("")
    problems = layout_problems(tests, {"math", "verl"}, {"conformance"})
    assert [p.split(":")[0] for p in problems] == [
        "tests/lab/nowhere/test_lab_lost.py", "tests/lab/test_lab_flat.py", "tests/math/__init__.py",
        "tests/math/helper.py", "tests/nowhere/test_lost.py", "tests/support/test_x.py", "tests/test_flat.py",
        "test_ok.py"], problems
