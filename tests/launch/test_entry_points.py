"""The recipe's entry point and the launcher beside it: recipe/rpg/main_rpg.py is Hydra's main around verl's
``run_ppo``; a command line that is the launcher's (a run, ``DRY_RUN``, ``--describe``, an override Hydra cannot read)
goes to the launcher in the same process (``rpg.launch.entry.cli``, also ``python -m rpg.launch``), and the launcher
gives Hydra's main only what main_rpg.py keeps (``rpg.launch.entry.hydra_reads`` decides for both, so a command line
never travels back)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from launching import env as _env

from rpg.launch.entry import hydra_reads, main

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "recipe" / "rpg" / "main_rpg.py"
NO_RUN = "+experiment=run_no_such_run"

CASES = [  # (command line, environment, Hydra's main takes it)
    ([], {}, True),
    (["trainer.total_training_steps=3"], {}, True),
    (["trainer.total_training_steps=3"], {"RPG_BACKEND": "cpu"}, True),  # a rehearsal needs a run
    ([NO_RUN], {}, False),
    (["--cfg", "job", NO_RUN], {}, True),  # Hydra's own flags: Hydra's
    ([NO_RUN], {"RPG_LAUNCHED": "1"}, True),  # a launcher made the checks
    (["trainer.total_training_steps=3"], {"DRY_RUN": "1"}, False),
    (["trainer.total_training_steps=3"], {"DRY_RUN": "maybe"}, False),  # the launcher's one line
    (["--cfg", "job"], {"DRY_RUN": "maybe"}, True),
    (["--describe"], {}, False),
    (["--gpu-mem-gib"], {}, False),  # a flag without its value: the launcher's one line
    (["bad=["], {}, False),  # an override Hydra cannot read: the launcher's one line
]


@pytest.mark.parametrize("argv,environ,hydra", CASES, ids=[f"{' '.join(a) or '-'}|{e}" for a, e, _ in CASES])
def test_the_launcher_gives_hydra_exactly_what_main_rpg_keeps(argv, environ, hydra, capsys):
    assert hydra_reads(argv, _env(**environ)) is hydra
    answer = main(argv, _env(**environ))
    if hydra:
        assert answer == argv  # to Hydra's main as it is
    else:
        assert answer == 2, capsys.readouterr()  # answered here: each of these is refused in one line
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_main_rpg_hands_a_run_to_the_launcher_and_keeps_hydras_flags():
    """main_rpg.py's paper run is the launcher's answer (in main_rpg.py's process: test_beta_road.py and
    test_launch_composes_once.py see its run_ppo in theirs); the launcher's command gives Hydra's flags to
    main_rpg.py's Hydra main."""
    run = subprocess.run([sys.executable, str(ENTRY), NO_RUN], env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and run.stderr.startswith("rpg.launch: no run run_no_such_run"), run.stderr
    job = subprocess.run([sys.executable, "-m", "rpg.launch", "--cfg", "job", "trainer.total_training_steps=3"],
                         env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert job.returncode == 0, job.stderr[-2000:]
    assert "total_training_steps: 3" in job.stdout and "rpg:" in job.stdout  # Hydra's main composed the recipe


def test_an_in_process_cpu_dry_run_after_verl_was_imported_leaves_the_process_as_it_was():
    """The tests' in-process launch (``launching.launch``) in a worker where an earlier test imported verl: the CPU
    dry run still finds verl's CPU platform (in the launcher's own process verl is imported after its variables),
    and the platform variables it sets end with it (before, the run failed with "Unknown platform 'cpu'" in such
    a worker, and they stayed for the tests after it)."""
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); import verl; from launching import env, launch; "
            "rc = launch(['run_rpg_7b_ufkl1e-4'], env(RPG_BACKEND='cpu', DRY_RUN='1')); "
            "print('rc', rc, os.environ.get('VERL_PLATFORM'))")
    p = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests" / "support")], env=_env(), capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert p.stdout.strip().splitlines()[-1:] == ["rc 0 None"], p.stderr[-2000:]
