"""The order in which the suite and the CI stages hand out their files (tests/conftest.py,
``pytest_collection_modifyitems``)."""

# The suite's slowest files (measured on 2 idle cores, 2026-11-27: 450 of its 685 test-seconds), handed out first,
# slowest first: with loadfile a worker takes a whole file, and one of these started last ran alone for up to a
# minute while the other worker idled (longest-first scheduling). Only the order depends on this list; a renamed
# file fails tests/project/test_suite_order.py.
SLOW_FILES_FIRST = (
    "tests/verl/test_resume.py", "tests/launch/test_launch_dryrun.py", "tests/cluster/test_multinode_units.py",
    "tests/lab/study/test_study.py", "tests/launch/test_launch_cli_mistakes.py", "tests/verl/test_separate_async_driver.py",
    "tests/math/test_losses_compiled.py", "tests/launch/test_launch_overrides.py", "tests/verl/test_driver_rules.py",
    "tests/backends/test_cpu_platform.py", "tests/backends/test_gpu_preflight.py", "tests/verl/test_verl_config.py",
    "tests/trainer_process/test_trainer_process.py", "tests/launch/test_launch_experiments.py",
    "tests/lab/study/test_smol_paper.py", "tests/lab/study/test_smol_loss.py", "tests/lab/gpu_kit/test_gpu_kit_stall.py",
    "tests/lab/gpu_kit/test_gpu_kit_folders.py",
)

# The CI stages' files of trainer launches and other long runs, with the seconds each took (the sum of its tests'
# setup, call and teardown on one xdist worker, measured on the 2-core development machine, 2026-11-28, in the one
# session `.ci/run` runs the stages in, the vLLM-CPU set-up beside it; the vLLM-CPU files in their own session):
# handed out longest first, so that the longest file starts at once and the shorter ones even out the end
# (longest-processing-time-first on the two workers). The seven stages' 5893 test-seconds took 2995 s of wall time
# in that order, 48 s over half their sum. Only the order depends on these figures; a renamed file fails
# tests/project/test_suite_order.py.
STAGE_FILE_SECONDS = {
    # distributed
    "tests/e2e/test_elastic.py": 1276, "tests/e2e/test_multinode.py": 695, "tests/e2e/test_distributed_e2e.py": 244,
    "tests/e2e/test_distributed_separate_async_e2e.py": 98, "tests/e2e/test_distributed_async_e2e.py": 93,
    # bench and smol (test_smol_e2e.py: the model's build, the smol stage's two-step run and three benchmark smoke runs)
    "tests/e2e/test_smol_e2e.py": 668, "tests/benchmarks/test_bench_trainer_modes.py": 224,
    "tests/benchmarks/test_bench_async.py": 137, "tests/benchmarks/test_bench_trainer.py": 112,
    "tests/benchmarks/test_bench_world_size.py": 108, "tests/benchmarks/test_bench_cpu_speed.py": 79,
    "tests/smol/test_smol_reference.py": 230,  # SmolLM2's first step twice and its build: measured 2026-11-28, load 3-8
    # resume_e2e
    "tests/e2e/test_async_kill_resume_e2e.py": 399, "tests/e2e/test_async_resume_e2e.py": 320,
    "tests/e2e/test_verl_reference_resume_e2e.py": 140, "tests/e2e/test_resume_e2e.py": 123,
    "tests/e2e/test_killed_save_e2e.py": 223,  # measured alone (2026-11-28), at a load of 4-6
    # gpu_kit (the kit's build: its downloads and xz) and repro
    "tests/lab/gpu_kit/test_gpu_kit_stage.py": 345, "tests/lab/gpu_kit/test_vllm_parts_stage.py": 68,
    "tests/e2e/test_repro_e2e.py": 131,
    # trainer_e2e
    "tests/e2e/test_launch_cpu_e2e.py": 87, "tests/e2e/test_verl_reinforce_pp_e2e.py": 75,
    "tests/e2e/test_cpu_e2e.py": 75, "tests/e2e/test_async_e2e.py": 69, "tests/e2e/test_refill_limit_e2e.py": 58,
    "tests/e2e/test_verl_e2e.py": 57,
    # vllm_cpu (and gpu_stack's test_distributed_e2e.py above), in the vLLM-CPU environment
    "tests/e2e/test_vllm_cpu.py": 470, "tests/e2e/test_vllm_cpu_smol.py": 250, "tests/e2e/test_vllm_cpu_distributed.py": 89,
    # conformance, in the same session (measured 2026-11-28 on the development machine at a load of 5 to 9)
    "tests/lab/conformance/test_conformance_frameworks.py": 73,
}
