"""The order in which the suite hands out its files (tests/conftest.py, ``pytest_collection_modifyitems``)."""

# The suite's slowest files (measured on 2 idle cores, 2026-11-27: 450 of its 685 test-seconds), handed out first,
# slowest first: with loadfile a worker takes a whole file, and one of these started last ran alone for up to a
# minute while the other worker idled (longest-first scheduling). Only the order depends on this list; a renamed
# file fails tests/project/test_suite_order.py.
SLOW_FILES_FIRST = (
    "tests/verl/test_resume.py", "tests/launch/test_launch_dryrun.py", "tests/cluster/test_multinode_units.py",
    "tests/study/test_study.py", "tests/launch/test_launch_cli_mistakes.py", "tests/verl/test_separate_async_driver.py",
    "tests/math/test_losses_compiled.py", "tests/launch/test_launch_overrides.py", "tests/verl/test_driver_rules.py",
    "tests/backends/test_cpu_platform.py", "tests/backends/test_gpu_preflight.py", "tests/verl/test_verl_config.py",
    "tests/trainer_process/test_trainer_process.py", "tests/launch/test_launch_experiments.py",
    "tests/study/test_smol_paper.py",
)
