"""The project's requirement files: ``requirement.txt`` (the paper's ``pip install -r requirement.txt``) holds
pyproject.toml's runtime dependencies line for line, so both installs get the same pins; the vLLM-CPU stage's
files sit beside it under the same scheme (``requirement-*.txt``) and start from it."""

from __future__ import annotations

from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_requirement_txt_is_pyprojects_dependencies():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert _lines(ROOT / "requirement.txt") == dependencies


def test_every_requirement_file_is_at_the_top_and_the_vllm_cpu_stage_starts_from_requirement_txt():
    assert not (ROOT / "requirements").exists()
    assert _lines(ROOT / "requirement-vllm-cpu.txt")[0] == "-r requirement.txt"
    includes = [line.split()[1] for path in ROOT.glob("requirement*.txt") for line in _lines(path)
                if line.startswith("-r ")]
    assert all((ROOT / name).is_file() for name in includes), includes
