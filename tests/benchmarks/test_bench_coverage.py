"""Every benchmark has a smoke test in the ``bench`` CI stage and a row in benchmarks/README.md, so that none can
stop running unseen (a benchmark that rotted: issue of the red team, round 3)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _is_bench_mark(node: ast.expr) -> bool:
    return ast.unparse(node).endswith("mark.bench")


def _bench_tests() -> dict[str, str]:
    """Each test file with a test in the ``bench`` stage (its own mark, or its module's ``pytestmark``): its source
    (the benchmark is run by the test or by a helper of its file)."""
    found = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        module_mark = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                          and "mark.bench" in ast.unparse(n.value) for n in tree.body)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and (
                    module_mark or any(_is_bench_mark(d) for d in node.decorator_list)):
                found[path.name] = source
    return found


def test_every_benchmark_has_a_bench_smoke_test_and_a_readme_row():
    tests = _bench_tests()
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("bench_*.py"))
    assert scripts, "no benchmark found"
    untested = [s for s in scripts if not any(s in src for src in tests.values())]
    assert untested == [], f"benchmarks without a smoke test marked bench: {untested}"
    unlisted = [s for s in scripts if f"| `{s}` |" not in readme]
    assert unlisted == [], f"benchmarks missing from benchmarks/README.md's table: {unlisted}"
