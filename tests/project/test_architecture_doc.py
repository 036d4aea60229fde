"""docs/architecture.md cannot drift from the code: its file table is written from the modules' docstrings
(``scripts/architecture_table.py``), and a package's ``__init__`` says what the package is for, not which modules
it holds (a hand-written module map goes stale at the first rename)."""

import ast
import functools
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("architecture_table", ROOT / "scripts" / "architecture_table.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)
INIT_DOC_LINES = 5


@functools.lru_cache(maxsize=None)
def real_table() -> str:
    return gen.table()


def test_the_file_table_is_generated_from_the_docstrings():
    assert gen.current(gen.DOC.read_text(encoding="utf-8")) == real_table(), (
        "regenerate the table of docs/architecture.md with python scripts/architecture_table.py --write")
    rows = real_table().splitlines()[2:]
    assert len(rows) == len([p for p in (ROOT / "rpg").rglob("*.py") if "__pycache__" not in p.parts])
    assert "| `rpg/math/fused.py` | The fused RPG losses" in real_table()


def test_check_fails_on_a_stale_table_and_write_renews_it(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "architecture.md"
    doc.write_text(gen.DOC.read_text(encoding="utf-8").replace("| `rpg/math/fused.py` | The fused RPG losses",
                                                               "| `rpg/math/fused.py` | Old words"), encoding="utf-8")
    monkeypatch.setattr(gen, "DOC", doc)
    monkeypatch.setattr(gen, "table", real_table)
    assert gen.main(["--check"]) == 1 and "--write" in capsys.readouterr().err
    assert gen.main(["--write"]) == 0 and gen.main(["--check"]) == 0
    assert gen.current(doc.read_text(encoding="utf-8")) == real_table()
    with pytest.raises(ValueError, match="lacks the markers"):
        gen.current(doc.read_text(encoding="utf-8").replace(gen.END, ""))
    assert gen.main([]) == 2


def test_a_row_is_the_first_sentence_of_the_docstring(tmp_path):
    (tmp_path / "rpg" / "a").mkdir(parents=True)
    (tmp_path / "rpg" / "__init__.py").write_text('"""The package. Its second sentence."""\n')
    (tmp_path / "rpg" / "a" / "__init__.py").write_text(
        '"""Losses (App. G, Sec. 3) for x | y, wrapped\nover two lines.\n\nDetails."""\n')
    assert gen.table(tmp_path).splitlines()[2:] == [
        "| `rpg/__init__.py` | The package. |",
        "| `rpg/a/__init__.py` | Losses (App. G, Sec. 3) for x \\| y, wrapped over two lines. |"]
    (tmp_path / "rpg" / "a" / "b.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="rpg/a/b.py: no module docstring"):
        gen.table(tmp_path)


def _init_files():
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "rpg").rglob("__init__.py"))


@pytest.mark.parametrize("rel", _init_files())
def test_a_package_docstring_says_what_the_package_is_for(rel):
    """At most five lines for an ``__init__`` that only imports (one that defines the package's own functions keeps
    the docstring of that code)."""
    tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
    defines = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body)
    doc = ast.get_docstring(tree) or ""
    assert doc.strip(), f"{rel}: no docstring saying what the package is for"
    assert defines or len(doc.strip().splitlines()) <= INIT_DOC_LINES, (
        f"{rel}: a {len(doc.strip().splitlines())}-line docstring; say what the package is for in at most "
        f"{INIT_DOC_LINES} lines (each module's own docstring and docs/architecture.md's file table say the rest)")
