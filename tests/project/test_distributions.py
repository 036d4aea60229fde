"""What each distribution installs: the recipe's wheel (the repository's root, ``rpg-verl``) holds the package
``rpg``, every tracked file of it and nothing of the lab; the lab's (``lab/``, ``rpg-lab``) holds ``rpg_lab`` with
the files its packages read beside their code. Each built by ``pip wheel --no-deps --no-build-isolation`` from a copy
of its sources (the checkout gets no build folder)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tracked(folder: str) -> set[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--", folder], capture_output=True, check=True)
    return {p for p in out.stdout.decode().split("\0") if p}


def _wheel(tmp: Path, sources: dict[str, Path]) -> set[str]:
    """The files of the wheel built from ``sources`` ({name in the copy: file or folder}), dist-info left out."""
    src = tmp / "src"
    for name, path in sources.items():
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, src / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(tmp / "wheel"), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if ".dist-info/" not in n}


@pytest.fixture(scope="module")
def recipe_wheel(tmp_path_factory) -> set[str]:
    return _wheel(tmp_path_factory.mktemp("recipe"), {"pyproject.toml": ROOT / "pyproject.toml",
                                                       "README.md": ROOT / "README.md", "LICENSE": ROOT / "LICENSE",
                                                       "rpg": ROOT / "rpg"})


@pytest.fixture(scope="module")
def lab_wheel(tmp_path_factory) -> set[str]:
    return _wheel(tmp_path_factory.mktemp("lab"), {"pyproject.toml": ROOT / "lab" / "pyproject.toml",
                                                    "rpg_lab": ROOT / "lab" / "rpg_lab"})


def test_the_recipes_wheel_is_rpg_whole_and_nothing_of_the_lab(recipe_wheel):
    assert {n.split("/")[0] for n in recipe_wheel} == {"rpg"}
    assert recipe_wheel == _tracked("rpg")


def test_the_labs_wheel_is_rpg_lab_with_the_files_its_packages_read(lab_wheel):
    from rpg_lab.demo import reference
    from rpg_lab.gpu_kit import build, stall

    assert {n.split("/")[0] for n in lab_wheel} == {"rpg_lab"}
    assert lab_wheel == {p.removeprefix("lab/") for p in _tracked("lab/rpg_lab")}
    read = [*reference.REFERENCES.glob("*.json"), build.HAVE_FILE, *stall.HOOK_DIR.glob("*.py")]
    assert len(read) >= 4 and {p.relative_to(ROOT / "lab").as_posix() for p in read} <= lab_wheel
