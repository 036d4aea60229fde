"""CLI: ``python -m rpg_lab.study [--dry-run] [--seeds 2] [--steps 16] ...`` (see ``--help`` and docs/study.md).

Runs the grid (resumable: finished runs are kept in ``--out`` and not repeated), then renders the
table and figures into ``--report-dir`` (default ``<out>/report``). ``--async-weights`` runs the
behaviour-weight grid instead: one method (``--methods``, default RPG-REINFORCE-UFKL with RPG-Style
Clip) in verl's colocate-async trainer with exact, truncated (1.0, per token) and dropped (uncorrected)
weights pi_old/mu, ``--seeds`` (default 3) each, into ``outputs/study_async_weights`` by default.
``--staleness 1,2,4,8`` runs the staleness study instead: the stress methods (RPG-Style Clip on / off) in verl's
separate-async trainer at each staleness x behaviour-weight arm (token, sequence, tis2, none), ``--seeds`` (default 3)
each, 8 steps by default, into ``outputs/study_staleness``. ``--lag`` runs the declared lag study
(docs/study/lag/PLAN.md: its cells x ``--seeds``, default 12, into ``outputs/study_lag``), writes ``runs.csv`` into
``--report-dir`` and renders ``results.md`` and ``lag.png`` from that CSV alone (``--render-only``: from the CSV,
without runs). ``--model smol`` runs the declared SmolLM2 comparison instead (docs/study/smol/PLAN.md: GRPO, RPG-UFKL
and RPG-REINFORCE-UFKL with RPG-Style Clip on SmolLM2-135M-Instruct, ``--seeds`` (default 3) each, one run at a time,
into ``outputs/study_smol``), its CSV, tables and figure as the lag study's; ``--model smol --paper`` the paper's
comparison on SmolLM2 (docs/study/smol-paper/PLAN.md: five methods, 12 seeds, into ``outputs/study_smol_paper``);
``--model smol --loss`` the loss comparison (docs/study/smol-loss/PLAN.md: six arms, into outputs/study_smol_loss). A
declared study also appends a row to ``attempts.csv`` in ``--report-dir`` at each start and end of its process
(``rpg_lab.study.attempts``). A declared study runs the design its plan
declares: another value of an option that shapes its runs (``--seeds``, ``--steps``, ``--val-n``, ``--cells`` ...)
is refused in one line naming the declared value, unless ``--exploratory``, which the start's design line, every
runs.csv row and results.md say (no verdict). ``--dry-run`` prints the grid and its time estimate and starts
nothing; ``--render-only`` renders what has finished.

A finished run is reused only when made with this start's settings, code (commit and uncommitted changes) and torch
threads per process; one made by other code or threads stops the start (and the dry run) with one line naming it,
unless ``--rerun-other-code`` runs it again (its folder moved to ``<out>/stale``, kept). A declared study's runs.csv
in ``--report-dir`` outlives ``--out``: a finished run it records whose folder is not in ``--out`` (made on another
machine) is kept as its row when the row's settings and threads are this start's and its code (commit and
uncommitted changes) is this one, or its code is named by ``--keep-recorded-code``; a failed one stays failed
(``rpg_lab.study.records``).

Every argument is checked before anything is run or written, under ``--dry-run`` too: one line
(``rpg_lab.study: ...``), exit 2: counts >= 1 (``--seeds 0`` is not the default), ``--timeout`` a finite
number of seconds > 0, ``--out`` / ``--report-dir`` not a file (nor under one), no option of another grid or
model; ``--render-only`` on a folder without a study (or with another grid's runs only) says so and creates nothing.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

from rpg.paths.user import user_folder
from rpg_lab.study.grid import (ADDENDUM_CELLS, ADDENDUM_ORDER_SEED, BUILTIN_COSTS, LAG_BUDGET_S, LAG_CELLS, LAG_COSTS, LAG_SEEDS, LAG_SIZES, LAG_UPDATES,
                            METHODS, STALENESS_ARMS, STALENESS_COSTS, STALENESS_SIZES, STRESS_METHODS, WEIGHT_ARMS,
                            ORDER_SEED, WEIGHTS_METHOD, Sizes, calibrate, describe, fmt_duration, grid, lag_grid, staleness_grid,
                            weights_grid)
from rpg_lab.study.smol import PILOT, SMOL_TIMEOUT_S, SmolSizes
from rpg_lab.study.smol import build_assets as build_smol
from rpg_lab.study.smol import built as smol_built

# why the SmolLM2 comparison runs one at a time (docs/smol.md, Cost: the run's peak PSS)
SMOL_ONE_AT_A_TIME = "a SmolLM2 run keeps both cores busy and peaks at about 13.4 GiB of memory"


def _ints(text: str) -> tuple[int, ...]:
    """Comma-separated integers, each element one (an empty value or element is refused, not dropped)."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _ints_or_none(text: str) -> tuple[int, ...]:
    """As ``_ints``; an empty value is the empty axis (``--stress ''``: no stress axis)."""
    return () if not text.strip() else _ints(text)


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _folder(flag: str, path: Path) -> None:
    """ValueError when ``path`` or a folder above it is a file (the study would stop with a traceback
    after its dry run; checked without creating anything)."""
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise ValueError(f"{flag} {path}: {part} is a file, not a directory")


def _no_study(out: Path, records: list[dict], found: list[dict]) -> str | None:
    """Why ``--render-only`` has nothing to render in ``out`` (no study there, or only another grid's runs)."""
    if not (out / "runs").is_dir():
        return f"no study in --out {out} (no {out / 'runs'}): run the study first, or name its folder"
    if not found:
        return f"no study in --out {out} ({out / 'runs'} holds no finished or failed run): run the study first"
    if not any(records):
        return (f"none of this grid's {len(records)} runs is in --out {out} (it holds {len(found)} "
                f"run{'' if len(found) == 1 else 's'} of another grid: other --methods, --seeds, sizes or "
                "--async-weights or --staleness?)")
    return None


def _declared(args):
    """The declared study that ``args`` run (its module: ``csv_rows``, ``write_csv``, ``render``) and its flag, or
    None for the other grids."""
    if args.lag and args.addendum:
        from rpg_lab.study.lag_addendum import ADDENDUM

        return ADDENDUM, "--lag --addendum"
    if args.lag:
        from rpg_lab.study import lag

        return lag, "--lag"
    if args.model == "smol":
        return _comparison(args), _comparison(args).flag
    return None


def _comparison(args):
    """The SmolLM2 comparison ``args`` run: the pilot, with ``--paper`` the paper's, with ``--loss`` the loss one."""
    if args.loss or args.paper:
        from rpg_lab.study.smol_loss import LOSS
        from rpg_lab.study.smol_paper import PAPER

        return LOSS if args.loss else PAPER
    return PILOT


def _begin_attempt(study, report_dir: Path, command: str, out: Path, records: list[dict]):
    """A declared study's start row in ``report_dir``'s attempts.csv (``rpg_lab.study.attempts``); None for the other
    grids."""
    if study is None:
        return None
    from rpg_lab.study.attempts import Attempt
    from rpg.run_record import code_state

    code = code_state((out, report_dir))["code"]
    return Attempt(report_dir, command, code, len(records)).begin(sum(r.get("status") == "done" for r in records))


def _recorded(study, args, report_dir: Path) -> dict[str, dict]:
    """A declared study's finished and failed runs.csv rows in ``report_dir`` by run id (``rpg_lab.study.records``:
    they stand for runs whose folders are gone); ValueError (one line) for a ``--keep-recorded-code`` that names no
    finished row's code, or with ``--render-only``."""
    csv_path = report_dir / "runs.csv"
    rows = study[0].read_csv(csv_path) if study is not None and csv_path.is_file() else []
    ended = {r["run_id"]: r for r in rows if r["status"] in ("done", "failed")}
    codes = sorted({r["code"] for r in ended.values() if r["status"] == "done" and r["code"]})
    for code in args.keep_recorded_code:
        if args.render_only:
            raise ValueError(f"--keep-recorded-code {code}: --render-only runs nothing and keeps nothing: drop one")
        if study is None:
            raise ValueError(f"--keep-recorded-code {code}: only a declared study (--lag, --model smol) keeps rows of "
                             "its runs.csv")
        if code not in codes:
            raise ValueError(f"--keep-recorded-code {code}: no finished run of {csv_path} was made by it (its codes: "
                             f"{', '.join(codes) or 'none'})")
    return ended


def _rows(module, out: Path, specs, records: list[dict], design: str) -> list[dict]:
    """runs.csv's rows: a run's from its folder, or, for a run kept as recorded (its folder gone), its row as it was."""
    from rpg_lab.study.records import RECORDED

    fresh = module.csv_rows(out, specs, [{} if RECORDED in r else r for r in records], design)
    return [rec[RECORDED] if RECORDED in rec else row for rec, row in zip(records, fresh)]


def _render_declared(study, report_dir: Path) -> int:
    """``--render-only`` of a declared study: its tables and figure from ``report_dir``'s runs.csv alone."""
    from rpg_lab.study.plan_and_results import CSVError

    module, flag = study
    csv_path = report_dir / "runs.csv"
    if not csv_path.is_file():
        print(f"rpg_lab.study: --render-only: no {csv_path}: run the study first (python -m rpg_lab.study {flag} "
              "--report-dir ...), or name the --report-dir that holds its runs.csv", file=sys.stderr)
        return 2
    try:
        paths = module.render(csv_path, report_dir)
    except (CSVError, ValueError) as err:
        print(f"rpg_lab.study: {err}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


def _finish_declared(study, out: Path, report_dir: Path, specs, records: list[dict], design: str) -> int:
    """After a declared study's runs: runs.csv (one row per run of the grid, of ``design``) into ``report_dir``, then
    the tables and figure from it."""
    module, _ = study
    try:
        module.write_csv(report_dir / "runs.csv", _rows(module, out, specs, records, design))
    except ValueError as err:
        print(f"rpg_lab.study: {err}", file=sys.stderr)
        return 2
    print(report_dir / "runs.csv")
    code = _render_declared(study, report_dir)
    failed = [r for r in records if r.get("status") != "done"]
    if failed:
        print(f"rpg_lab.study: {len(failed)} of {len(specs)} runs did not finish (see runs.csv)", file=sys.stderr)
        return 1
    return code


def _design(study, args, specs, report_dir: Path) -> str | None:
    """The ``design`` of a declared study's runs.csv rows (``rpg_lab.study.plan_and_results.Design.label``; None for the
    other grids), after its checks (ValueError, one line): ``--exploratory`` only with a declared study; an option the
    plan fixes otherwise only with it; a runs.csv in ``report_dir`` of another design, or with finished runs this
    grid lacks, refused before any run (``rpg_lab.study.plan_and_results.check_report``)."""
    from rpg_lab.study.plan_and_results import check_report

    if study is None:
        if args.exploratory:
            raise ValueError("--exploratory: only a declared study (--lag, --model smol) has a design to depart "
                             "from; the other grids are exploratory already")
        return None
    module, _ = study
    label = module.DESIGN.label(module.chosen(specs), args.exploratory)
    if not args.render_only:
        check_report(report_dir / "runs.csv", module.SCHEMA, label, {s.run_id for s in specs})
    return label


def parser() -> argparse.ArgumentParser:
    d = Sizes()
    ap = argparse.ArgumentParser(prog="python -m rpg_lab.study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None,
                    help="run directory (default outputs/study; outputs/study_async_weights with --async-weights, "
                         "outputs/study_staleness with --staleness, outputs/study_lag with --lag)")
    ap.add_argument("--report-dir", type=Path, default=None, help="where the table/figures go (default OUT/report)")
    ap.add_argument("--seeds", type=int, default=None,
                    help=f"seeds per method (1..SEEDS; default 2, 3 with --async-weights or --staleness, {LAG_SEEDS} "
                         "with --lag)")
    st = STALENESS_SIZES
    ap.add_argument("--steps", type=int, default=None,
                    help=f"training steps per run (default {d.steps}; {st.steps} with --staleness, {LAG_SIZES.steps} "
                         "with --lag)")
    ap.add_argument("--test-freq", type=int, default=None,
                    help=f"validate every K steps (default {d.test_freq}; {st.test_freq} with --staleness)")
    ap.add_argument("--prompts", type=int, default=None, help=f"prompts per rollout batch (default {d.prompts})")
    ap.add_argument("--n", type=int, default=None, help=f"responses per prompt (default {d.n})")
    ap.add_argument("--val-n", type=int, default=None,
                    help=f"validation samples per problem (default {d.val_n}; {LAG_SIZES.val_n} with --lag)")
    ap.add_argument("--updates", type=int, default=None,
                    help="optimizer steps per rollout batch of the main grid (default 4)")
    ap.add_argument("--stress", type=_ints_or_none, default=None,
                    help="optimizer steps per rollout batch of the clip stress axis (default 1,4,16; '' = none)")
    ap.add_argument("--methods", type=_names, default=METHODS,
                    help="comma-separated paper run names (default: the six methods; the three with --model smol)")
    ap.add_argument("--stress-methods", type=_names, default=None, help="run names of the stress axis")
    ap.add_argument("--async-weights", action="store_true",
                    help=f"the behaviour-weight grid: arms {', '.join(WEIGHT_ARMS)} in the colocate-async trainer")
    ap.add_argument("--staleness", type=_ints, default=(),
                    help=f"the staleness study at these staleness values (e.g. 1,2,4,8): the stress methods x arms "
                         f"{', '.join(STALENESS_ARMS)} in the separate-async trainer")
    ap.add_argument("--lag", action="store_true",
                    help=f"the declared lag study (docs/study/lag/PLAN.md): its cells x --seeds (default {LAG_SEEDS}) "
                         "in the separate-async trainer, one CSV row per run, tables and figure from the CSV")
    ap.add_argument("--addendum", action="store_true",
                    help="with --lag: the lag study's declared addendum (docs/study/lag-addendum/PLAN.md: the lag-0 "
                         "cell with RPG-Style Clip and the three it is compared with, into outputs/study_lag_addendum)")
    ap.add_argument("--cells", type=_names, default=None,
                    help="with --lag: only these cells (comma-separated names; default all: "
                         f"{', '.join(c.name for c in LAG_CELLS)})")
    ap.add_argument("--model", default="tiny",
                    help="what the runs train: tiny (default: the tiny model and task), or smol: the declared "
                         "SmolLM2 comparison (docs/study/smol/PLAN.md; --seeds default 3, --steps "
                         f"{PILOT.sizes.steps}, one run at a time, into outputs/study_smol)")
    smol_comparison = ap.add_mutually_exclusive_group()  # --paper or --loss
    smol_comparison.add_argument("--paper", action="store_true",
                    help="with --model smol: the paper's comparison on SmolLM2 (docs/study/smol-paper/PLAN.md: five "
                         "methods x --seeds, default 12, into outputs/study_smol_paper)")
    smol_comparison.add_argument("--loss", action="store_true", help="with --model smol: the loss comparison on "
                                 "SmolLM2 (docs/study/smol-loss/PLAN.md: six arms x --seeds, default 12 from seed 101)")
    ap.add_argument("--val-problems", type=int, default=None,
                    help=f"with --model smol: held-out problems per validation (default {PILOT.sizes.val_problems}, all; "
                         "fewer are drawn by verl by data.seed, so each seed validates on its own subset)")
    ap.add_argument("--dry-run", action="store_true", help="print the grid and its time estimate; run nothing")
    ap.add_argument("--render-only", action="store_true", help="render the finished runs; run nothing")
    ap.add_argument("--retry-failed", action="store_true", help="run failed runs again")
    ap.add_argument("--rerun-other-code", action="store_true",
                    help="run again the finished runs made by other code (another commit, or other uncommitted "
                         "changes) or another torch thread count (without it the start refuses; never reused)")
    ap.add_argument("--keep-recorded-code", action="append", default=[], metavar="CODE",
                    help="with a declared study: its finished runs that --report-dir's runs.csv records as made by "
                         "CODE (its code column) and whose folders are not in --out are kept as recorded, beside "
                         "this code's runs (repeatable; without it such rows of other code stop the start)")
    ap.add_argument("--exploratory", action="store_true",
                    help="with --lag or --model smol: run another design than the plan's, said in every output "
                         "(without it the study refuses an option the plan fixes otherwise)")
    ap.add_argument("--jobs", type=int, default=None,
                    help="runs at a time (default 2: on 2 cores a tiny run alone leaves them ~40%% idle during its "
                         f"start-up; 1 with --model smol, the only value: {SMOL_ONE_AT_A_TIME})")
    ap.add_argument("--timeout", type=float, default=None,
                    help=f"seconds before one run is killed (default 1800; {SMOL_TIMEOUT_S:.0f} with --model smol)")
    return ap


def _smol_grid(args) -> list:
    """The SmolLM2 comparison's runs from ``args`` (ValueError, one line, for an option it does not take)."""
    from rpg.smol import overrides as smol

    other = [flag for flag, on in (("--lag", args.lag), ("--staleness", bool(args.staleness)),
                                   ("--async-weights", args.async_weights), ("--cells", args.cells is not None)) if on]
    if other:
        raise ValueError(f"{other[0]} is a study of the tiny model; --model smol runs the methods comparison "
                         "(docs/study/smol/PLAN.md)")
    fixed = [flag for flag, value in (("--prompts", args.prompts), ("--n", args.n), ("--val-n", args.val_n),
                                      ("--updates", args.updates), ("--stress", args.stress),
                                      ("--stress-methods", args.stress_methods)) if value is not None]
    if fixed:
        raise ValueError(f"{fixed[0]}: --model smol runs at the SmolLM2 run's sizes ({smol.TRAIN_BATCH_SIZE} prompts "
                         f"x {smol.ROLLOUT_N} responses, mini-batches of {smol.MINI_BATCH_SIZE} prompts, "
                         f"{smol.VAL_N} response per validation problem: rpg.smol.overrides)")
    if args.jobs not in (None, 1):
        raise ValueError(f"--jobs {args.jobs}: --model smol runs one at a time ({SMOL_ONE_AT_A_TIME})")
    study = _comparison(args)
    steps = study.sizes.steps if args.steps is None else args.steps
    sizes = SmolSizes(steps=steps, test_freq=steps if args.test_freq is None else args.test_freq,
                      val_problems=study.sizes.val_problems if args.val_problems is None else args.val_problems,
                      val_n=study.sizes.val_n)
    return study.grid(args.seeds, sizes, None if args.methods == METHODS else args.methods)


def _tiny_grid(args) -> list:
    """The tiny model's grids from ``args``: the main grid, --async-weights, --staleness or --lag."""
    d = Sizes()
    base = LAG_SIZES if args.lag else STALENESS_SIZES if args.staleness else d
    sizes = Sizes(base.steps if args.steps is None else args.steps,
                  base.test_freq if args.test_freq is None else args.test_freq,
                  d.prompts if args.prompts is None else args.prompts, d.n if args.n is None else args.n,
                  base.val_n if args.val_n is None else args.val_n)
    updates = 4 if args.updates is None else args.updates
    if args.val_problems is not None:
        raise ValueError("--val-problems sets SmolLM2's validation: use it with --model smol")
    chosen = [flag for flag, on in (("--lag", args.lag), ("--staleness", bool(args.staleness)),
                                    ("--async-weights", args.async_weights)) if on]
    if len(chosen) > 1:
        two = "two " if len(chosen) == 2 else ""
        raise ValueError(f"{' and '.join(chosen)} are {two}different grids; choose one")
    if args.cells is not None and not args.lag:
        raise ValueError("--cells selects cells of the lag study: use it with --lag")
    if args.lag:
        other = [flag for flag, value in (("--updates", args.updates), ("--stress", args.stress),
                                          ("--stress-methods", args.stress_methods),
                                          ("--methods", None if args.methods == METHODS else args.methods))
                 if value is not None]
        if other:
            raise ValueError(f"{other[0]} sets another grid; the lag study's cells fix its methods and "
                             f"{LAG_UPDATES} updates per weight version (docs/study/lag/PLAN.md)")
        cells = ADDENDUM_CELLS if args.addendum else LAG_CELLS
        names = args.cells if args.cells is not None else tuple(c.name for c in cells)
        bad = [n for n in names if n not in {c.name for c in cells}]
        if bad or not names:
            raise ValueError(f"--cells {','.join(bad) or '(none)'}: expected some of "
                             f"{', '.join(c.name for c in cells)}")
        return lag_grid(LAG_SEEDS if args.seeds is None else args.seeds, sizes,
                        tuple(c for c in cells if c.name in names),
                        order_seed=ADDENDUM_ORDER_SEED if args.addendum else ORDER_SEED)
    if args.staleness:
        methods = args.methods if args.methods != METHODS else STRESS_METHODS
        return staleness_grid(3 if args.seeds is None else args.seeds, args.staleness, sizes, methods)
    if args.async_weights:
        if args.methods != METHODS and len(args.methods) != 1:
            raise ValueError(f"--async-weights runs one method; --methods names {len(args.methods)}")
        method = args.methods[0] if args.methods != METHODS else WEIGHTS_METHOD
        return weights_grid(3 if args.seeds is None else args.seeds, updates, sizes, method)
    return grid(2 if args.seeds is None else args.seeds, updates, (1, 4, 16) if args.stress is None else args.stress,
                sizes, args.methods, STRESS_METHODS if args.stress_methods is None else args.stress_methods)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from rpg_lab.study.records import all_records, records_now, survey
    from rpg_lab.study.runner import OtherRunsError, StudyBusyError, run_grid
    from rpg.stop_signals import StopSignal
    from rpg.launch.experiments import ExperimentError

    on_smol = args.model == "smol"
    # relative to the current folder, as every run folder a user names (rpg.paths.user)
    for flag, on, what in (("--paper", args.paper, "the paper's"), ("--loss", args.loss, "the loss")):
        if on and not on_smol:
            print(f"rpg_lab.study: {flag}: {what} comparison runs on SmolLM2: add --model smol", file=sys.stderr)
            return 2
    if args.addendum and not args.lag:
        print("rpg_lab.study: --addendum: the lag study's addendum: add --lag", file=sys.stderr)
        return 2
    name = (_comparison(args).out_name if on_smol else "study_lag_addendum" if args.lag and args.addendum
            else "study_lag" if args.lag else "study_staleness" if args.staleness
            else "study_async_weights" if args.async_weights else "study")
    args.out = user_folder(args.out or Path("outputs") / name)
    try:
        if args.model not in ("tiny", "smol"):
            raise ValueError(f"--model {args.model}: expected tiny or smol")
        specs = _smol_grid(args) if on_smol else _tiny_grid(args)
        jobs = args.jobs if args.jobs is not None else 1 if on_smol else 2
        timeout = args.timeout if args.timeout is not None else SMOL_TIMEOUT_S if on_smol else 1800.0
        if jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {jobs}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"--timeout must be a finite number of seconds > 0, got {timeout:g}")
        report_dir = user_folder(args.report_dir) if args.report_dir else args.out / "report"
        for flag, path in (("--out", args.out), ("--report-dir", report_dir)):
            _folder(flag, path)
        study = _declared(args)
        design = _design(study, args, specs, report_dir)
        recorded = _recorded(study, args, report_dir) if not args.render_only or args.keep_recorded_code else {}
        keep = tuple(args.keep_recorded_code)
    except (ValueError, ExperimentError) as err:
        print(f"rpg_lab.study: {err}", file=sys.stderr)
        return 2
    if study and args.render_only:
        return _render_declared(study, report_dir)
    records = records_now(args.out, specs, recorded)
    if args.render_only and (problem := _no_study(args.out, records, all_records(args.out))):
        print(f"rpg_lab.study: --render-only: {problem}", file=sys.stderr)
        return 2
    budget = LAG_BUDGET_S if args.lag else _comparison(args).budget_s if on_smol else None
    costs = calibrate(all_records(args.out), _comparison(args).cost_model(specs[0].sizes.val_problems) if on_smol else LAG_COSTS
                      if args.lag else STALENESS_COSTS if args.staleness else BUILTIN_COSTS)
    if args.dry_run:  # what the real start would do, by the same survey, and its start line
        found = survey(specs, args.out, args.retry_failed, args.rerun_other_code, (report_dir,), recorded, keep)
        kept = {specs[i].run_id for i in range(len(specs)) if not found.runs(i)}
        if study:
            print(study[0].DESIGN.line(design))
        print(describe(specs, costs, kept, jobs, {s.run_id: st for s, st in zip(specs, found.states)}))
        if budget is not None:
            est = costs.grid_s([s for s in specs if s.run_id not in kept], jobs)
            print(f"{'lag' if args.lag else 'smol'} study budget {fmt_duration(budget)}: the estimate "
                  + ("fits" if est <= budget else "EXCEEDS it"))
        if on_smol and not smol_built():
            print("SmolLM2 is not built yet: the study builds it before its first run (docs/smol.md, The model)")
        print(found.line(costs, jobs))
        if refusal := found.refusal():
            print(f"rpg_lab.study: {refusal}", file=sys.stderr)
            return 2
        return 0
    command = "python -m rpg_lab.study " + shlex.join(argv if argv is not None else sys.argv[1:])
    if not args.render_only:
        from rpg.smol import SmolAssetError

        if study:
            print(study[0].DESIGN.line(design), flush=True)
        attempt = _begin_attempt(study, report_dir, command, args.out, records)
        how = "error"
        try:
            if on_smol:
                build_smol()
            records = run_grid(specs, args.out, costs, retry_failed=args.retry_failed, timeout_s=timeout, jobs=jobs,
                               rerun_other=args.rerun_other_code, outputs=(report_dir,), recorded=recorded,
                               keep_codes=keep)
            left = sum(r.get("status") != "done" for r in records)
            how = f"{left} runs not finished" if left else "finished"
        # another study on --out; finished runs there of other code or threads; SmolLM2 cannot be built
        except (StudyBusyError, OtherRunsError, SmolAssetError) as err:
            how = f"refused: {err}"
            print(f"rpg_lab.study: {err}", file=sys.stderr)
            return 2
        except StopSignal as stop:  # the finished runs still reach runs.csv and the report
            how = f"stopped by {stop.name}"
            if study:
                _finish_declared(study, args.out, report_dir, specs, records_now(args.out, specs, recorded), design)
            raise
        except BaseException as err:
            how = f"error: {type(err).__name__}: {err}"[:300]
            raise
        finally:
            if attempt is not None:
                attempt.end(how, sum(r.get("status") == "done" for r in records_now(args.out, specs, recorded)))
    if study:
        return _finish_declared(study, args.out, report_dir, specs, records, design)
    from rpg_lab.study.render import render

    try:
        paths = render(args.out, report_dir, specs, records, 4 if args.updates is None else args.updates,
                       command.strip())
    except ValueError as err:
        print(f"rpg_lab.study: {err}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    failed = [r for r in records if r.get("status") != "done"]
    if failed:
        print(f"rpg_lab.study: {len(failed)} of {len(specs)} runs did not finish (see runs.md)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
