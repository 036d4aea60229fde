"""The cost of the data-file check before Ray (``rpg.data.checks.file_problems``: a parquet file's footer, its
``data_source`` column and the leaf ``reward_model.ground_truth``) against reading the whole file (``pyarrow.parquet.read_table``, the least verl's
loader does), per file, measured in one run, with the ratio check / full read.

    python benchmarks/bench_data_checks.py [--repeats 20] [--train-rows 13900] [FILE.parquet ...]

Files: the ones given, else the real evaluation files in ``../shared/data`` next to the project (AIME24,
AIME25, AMC23 in the authors' 32-copies layout), plus a training file of ``--train-rows`` rows written with
``rpg.data``'s writer (the size of DAPO-Math-17k English). Medians over ``--repeats`` runs, after one warm-up
(the page cache holds the files: the figures are CPU cost, not disk reads). A shared machine is noisy:
compare the ratios of one invocation. Figures: benchmarks/README.md#bench_data_checkspy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up: imports, page cache
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def train_file(path: Path, rows: int) -> Path:
    from rpg.data.io import write_parquet_atomic
    from rpg.data.rows import Problem, build_rows

    text = "Let $x$ be a real number such that $x^2 - 5x + 6 = 0$ and ... find the sum of all possible values. " * 3
    problems = [Problem(f"{i}: {text}", str(i), i) for i in range(rows)]
    write_parquet_atomic(build_rows(problems, "math_dapo", "train"), path)
    return path


def main(argv: list[str] | None = None) -> int:
    import pyarrow.parquet as pq

    from rpg.data.checks import file_problems
    from rpg.reward.scored_sources import rpg_scorer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--train-rows", type=int, default=13900, help="rows of the written training file (0: none)")
    args = ap.parse_args(argv)
    files = list(args.files) or sorted(SHARED.glob("*.parquet"))
    if not args.files and not files:
        print(f"note: no real evaluation files at {SHARED}; the written training file only", file=sys.stderr)
    scorer = rpg_scorer("")
    with tempfile.TemporaryDirectory() as tmp:
        if args.train_rows > 0:
            files.append(train_file(Path(tmp) / "train.parquet", args.train_rows))
        print(f"{'file':28s} {'rows':>6s} {'MiB':>6s} {'check ms':>9s} {'full read ms':>13s} {'ratio':>6s}")
        total_check = 0.0
        for path in files:
            problems = file_problems("data.val_files", str(path), scorer=scorer)
            check = median_ms(lambda: file_problems("data.val_files", str(path), scorer=scorer), args.repeats)
            full = median_ms(lambda: pq.read_table(path), args.repeats)
            total_check += check
            rows = pq.read_metadata(path).num_rows
            print(f"{path.name:28s} {rows:6d} {path.stat().st_size / 2**20:6.2f} {check:9.2f} {full:13.2f} "
                  f"{check / full:6.3f}" + (f"  problems: {problems}" if problems else ""))
        print(f"all {len(files)} files checked in {total_check:.1f} ms (sum of medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
