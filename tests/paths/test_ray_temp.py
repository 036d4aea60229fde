"""The run's private Ray folder is made where Ray's socket paths fit (``rpg.paths.ray_temp``): under a long
TMPDIR Ray's own check (``validate_socket_filepath``) would stop the run after its processes started; the folder is
made under a short one instead, with a note, or the run is refused in one line before anything starts."""

from __future__ import annotations

import os
import tempfile
import textwrap
from pathlib import Path

import pytest
from ray._private.utils import validate_socket_filepath

from rpg.paths import ray_temp
from rpg.paths.ray_temp import RayTempError, fits, longest_base, make_ray_temp

# the longest socket path Ray 2.60 makes under its folder (ray/_private/node.py): the session of a process with the
# largest pid Linux allows, the dashboard's longest module socket
RAY_LONGEST = "/session_2026-11-28_19-51-17_123456_4194304/sockets/dash_TaskEventsHead"


def _long_dir(root: Path) -> Path:
    """A TMPDIR of 60 bytes or more (pytest's own folder is longer than Ray's paths allow)."""
    d = root / ("t" * max(1, 60 - len(str(root)) - 1))
    d.mkdir()
    assert len(str(d)) >= 60 and not fits(str(d))
    return d


def test_the_rule_agrees_with_rays_own_check(tmp_path):
    """A folder the rule accepts holds Ray's longest socket path within Ray's limit; TMPDIRs of 31 bytes (an HPC
    job's /scratch/slurm_job_12345678/tmp) and 60 bytes, as the run's folder under them, do not."""
    base = "/" + "b" * (longest_base() - 1)
    folder = base + "/" + ray_temp.PREFIX + "x" * 8
    assert fits(folder)
    validate_socket_filepath(folder + RAY_LONGEST)  # Ray's own check: passes
    for n in (31, 60):
        too_long = "/" + "s" * (n - 1) + "/" + ray_temp.PREFIX + "x" * 8
        assert not fits(too_long)
        with pytest.raises(OSError, match="AF_UNIX path length"):
            validate_socket_filepath(too_long + RAY_LONGEST)


def test_a_long_tmpdir_gets_a_short_folder_with_a_note_and_none_is_refused_in_one_line(tmp_path, monkeypatch):
    short = tempfile.gettempdir()
    assert fits(os.path.join(short, "rpgrayxxxxxxxx"))  # this machine's own temporary folder is short
    long = _long_dir(tmp_path)
    folder, note = make_ray_temp(str(long))
    try:
        assert fits(folder) and Path(folder).is_dir() and not any(Path(folder).iterdir())
        assert Path(folder).parent == Path(ray_temp.SHORT_BASES[0]) and str(long) in note and folder in note
    finally:
        os.rmdir(folder)
    same, none = make_ray_temp(short)
    os.rmdir(same)
    assert Path(same).parent == Path(short) and none is None
    monkeypatch.setattr(ray_temp, "SHORT_BASES", (str(tmp_path / "missing"), str(long)))
    with pytest.raises(RayTempError) as err:
        make_ray_temp(str(long))
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"TMPDIR={long} is {len(str(long))} bytes long") and f"at most {longest_base()}" in line
    assert sorted(long.iterdir()) == []  # nothing made


STAND_IN = """
    import sys
    print("ray temp dir:", next(a for a in sys.argv if "_temp_dir=" in a).split("=", 1)[1], flush=True)
"""


def test_a_run_under_a_long_tmpdir_hands_ray_a_folder_where_its_paths_fit(tmp_path, monkeypatch):
    """run_trainer with a TMPDIR of 60 bytes or more: the trainer (a stand-in entry printing its arguments) gets a Ray
    folder where Ray's paths fit, the run says where, and the folder is gone afterwards."""
    from rpg.trainer_process import run_trainer

    entry = tmp_path / "entry.py"
    entry.write_text(textwrap.dedent(STAND_IN))
    long = _long_dir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    monkeypatch.setenv("TMPDIR", str(long))
    run = run_trainer([], output_dir=tmp_path / "out", entry=str(entry), timeout_s=120, reap_after_s=2)
    folder = next(ln.split("ray temp dir: ", 1)[1] for ln in run.log.splitlines() if "ray temp dir: " in ln).strip("'\"")
    assert fits(folder) and not os.path.exists(folder), folder
    assert any(folder in n and str(long) in n for n in run.notes), run.notes
