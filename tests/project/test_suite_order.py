"""The suite's own order (tests/conftest.py): files with end-to-end runs are handed out first, then the
slowest files (tests/support/suite_order.py), and xdist keeps that order; the vllm_cpu tests leave visibly; all
from conftest's one hook of each name (two hooks of the same name in conftest once made the later silently
replace the earlier, and the trainer launches ran last)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# a collection in a child process, reporting the collected files in order and xdist's reorder switch
PROBE = """
import sys, pytest
class Probe:
    def pytest_collection_finish(self, session):
        print("FILES", *dict.fromkeys(item.nodeid.split("::")[0] for item in session.items))
        print("REORDER", session.config.option.loadscopereorder)
sys.exit(pytest.main(["-p", "no:cacheprovider", "--collect-only", *sys.argv[1:]], plugins=[Probe()]))
"""


def test_e2e_files_come_first_xdist_keeps_the_order_and_vllm_cpu_tests_leave():
    # a unit-test file that imports no torch nor verl (its collection is the child's cost), before an e2e file of
    # the trainer_e2e stage
    files = ["tests/cluster/test_launch_ray_cluster.py", "tests/cluster/test_multinode_units.py",
             "tests/e2e/test_launch_cpu_e2e.py", "tests/e2e/test_vllm_cpu.py"]
    out = subprocess.run([sys.executable, "-c", PROBE, *files, "--trainer-e2e"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert ("FILES tests/e2e/test_launch_cpu_e2e.py tests/cluster/test_multinode_units.py "  # a slow file next
            "tests/cluster/test_launch_ray_cluster.py\n") in out.stdout, \
        out.stdout[-2000:]
    assert "REORDER False" in out.stdout  # xdist's loadfile would reorder files by test count
    assert re.search(r"\b\d+ deselected\b", out.stdout) and "vllm_cpu tests: deselected" in out.stdout


def test_the_slow_files_handed_out_first_exist():
    from suite_order import SLOW_FILES_FIRST

    assert len(set(SLOW_FILES_FIRST)) == len(SLOW_FILES_FIRST)
    assert [name for name in SLOW_FILES_FIRST if not (ROOT / name).is_file()] == []


def test_a_stages_launch_files_go_longest_first_and_exist():
    """The distributed stage's files in the order of their measured seconds: its longest (the elastic runs) first,
    before the files collected ahead of it."""
    from suite_order import STAGE_FILE_SECONDS

    assert [name for name in STAGE_FILE_SECONDS if not (ROOT / name).is_file()] == []
    files = ["tests/e2e/test_distributed_async_e2e.py", "tests/e2e/test_distributed_e2e.py",
             "tests/e2e/test_elastic.py", "tests/e2e/test_multinode.py", "tests/verl/test_dp_equivalence.py"]
    out = subprocess.run([sys.executable, "-c", PROBE, *files, "--distributed", "-m", "distributed"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert ("FILES tests/e2e/test_elastic.py tests/e2e/test_multinode.py tests/e2e/test_distributed_e2e.py "
            "tests/e2e/test_distributed_async_e2e.py tests/verl/test_dp_equivalence.py\n") in out.stdout, \
        out.stdout[-2000:]


def test_several_stages_in_one_session_each_is_tallied_and_one_that_ran_no_test_fails_it():
    """`.ci/run` runs the stages in one session: each stage asked for prints its tests and test-seconds, and one
    that ran no test (here ``repro``: its option given, none of its tests selected) fails the session although
    every test passed, as a session of that stage alone fails (pytest's exit code 5)."""
    target = ("tests/cluster/test_elastic_pool.py::"
              "test_an_elastic_separate_async_submission_hands_the_pool_to_the_supervisor")
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", target, "--distributed",
                          "--repro"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and re.search(r"\b1 passed\b", text) and "failed" not in text, text[-3000:]
    tally = [ln for ln in text.splitlines() if "(--distributed)" in ln and "test-seconds" in ln]  # the stage's tally
    assert len(tally) == 1 and re.search(r"\b1 tests, \d+ test-seconds", tally[0]), text[-3000:]
    assert "the repro stage (--repro): 0 tests, 0 test-seconds" in text, text[-3000:]
    assert "the repro stage was asked for (--repro) and ran no test" in text, text[-3000:]
    # each stage test's end is said as it comes, with its seconds (a session stopped from outside still shows them)
    assert re.search(rf"\[stage\] done {re.escape(target)} \(\d+ s\)", text), text[-3000:]
