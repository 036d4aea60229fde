"""The order in which the suite and the CI stages hand out their files (tests/conftest.py,
``pytest_collection_modifyitems``)."""

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

# The CI stages' files of trainer launches, with the seconds each took (the sum of its tests' setup and call, one
# xdist worker, measured on the 2-core development machine, 2026-11-27): handed out longest first, so that in each
# stage the longest file starts at once and the shorter ones even out the end (longest-processing-time-first on the
# two workers). The distributed stage handed out its files in collection order: its 1079 s file started at 170 s
# beside files summing 1103 s, and the stage took 1312 s; longest first it needs about 1103 s plus its starts. Only
# the order depends on these figures; a renamed file fails tests/project/test_suite_order.py.
STAGE_FILE_SECONDS = {
    # distributed
    "tests/e2e/test_elastic.py": 1079, "tests/e2e/test_multinode.py": 593, "tests/e2e/test_distributed_e2e.py": 210,
    "tests/e2e/test_distributed_separate_async_e2e.py": 88, "tests/e2e/test_distributed_async_e2e.py": 82,
    # resume_e2e
    "tests/e2e/test_async_kill_resume_e2e.py": 342, "tests/e2e/test_async_resume_e2e.py": 277,
    "tests/e2e/test_resume_e2e.py": 148, "tests/e2e/test_verl_reference_resume_e2e.py": 110,
    # bench (test_smol_e2e.py's three benchmark smoke runs; in the smol stage its two-step run and the build)
    "tests/benchmarks/test_bench_trainer_modes.py": 277, "tests/e2e/test_smol_e2e.py": 192,
    "tests/benchmarks/test_bench_trainer.py": 189, "tests/benchmarks/test_bench_world_size.py": 148,
    "tests/benchmarks/test_bench_async.py": 135, "tests/benchmarks/test_bench_cpu_speed.py": 93,
    # trainer_e2e
    "tests/e2e/test_launch_cpu_e2e.py": 77, "tests/e2e/test_async_e2e.py": 71, "tests/e2e/test_cpu_e2e.py": 68,
    "tests/e2e/test_verl_reinforce_pp_e2e.py": 68, "tests/e2e/test_verl_e2e.py": 45,
    "tests/e2e/test_refill_limit_e2e.py": 45,
}
