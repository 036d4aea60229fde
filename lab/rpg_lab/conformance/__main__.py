"""python -m rpg_lab.conformance [--out DIR] [--envs DIR] [--frameworks A,B] [--render-only]

Scores every framework's KL settings (each probe in its environment: lab/scripts/setup_conformance.sh), writes
DIR/conformance/conformance.csv, the report DIR/conformance.md and its figure DIR/conformance/conformance.png
(DIR: the checkout's docs/). ``--frameworks``: those frameworks' rows only, the others kept from the CSV already
there. ``--render-only``: the report and the figure from the CSV, nothing run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from rpg_lab.conformance import catalogue, environments, report, table

DOCS = environments.LAB.parent / "docs"


def paths(out: Path) -> tuple[Path, Path, Path]:
    return out / "conformance" / report.CSV_NAME, out / "conformance.md", out / "conformance" / report.FIGURE_NAME


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rpg_lab.conformance", description=__doc__.splitlines()[2])
    parser.add_argument("--out", type=Path, default=DOCS, help="the docs folder to write into (default: %(default)s)")
    parser.add_argument("--envs", type=Path, default=None,
                        help=f"the frameworks' environments (default: ${environments.ENVS_VARIABLE} or "
                             f"{environments.DEFAULT_ENVS})")
    parser.add_argument("--frameworks", default=None, help=f"a comma-separated subset of {', '.join(catalogue.FRAMEWORKS)}")
    parser.add_argument("--render-only", action="store_true", help="rebuild the report and figure from the CSV")
    args = parser.parse_args(argv)
    csv_path, md_path, figure_path = paths(args.out)
    torch.set_num_threads(1)  # tiny tensors: a loaded machine's thread pool costs 100 times the work
    if args.render_only:
        if not csv_path.is_file():
            parser.error(f"--render-only: {csv_path} does not exist (run without --render-only first)")
        rows = table.read_csv(csv_path)
    else:
        names = None if args.frameworks is None else args.frameworks.split(",")
        unknown = sorted(set(names or ()) - set(catalogue.FRAMEWORKS))
        if unknown:
            parser.error(f"--frameworks: {', '.join(unknown)} unknown; choose among {', '.join(catalogue.FRAMEWORKS)}")
        fresh = table.build(names, args.envs)
        kept = [r for r in table.read_csv(csv_path) if r["framework"] not in names] if names and csv_path.is_file() else []
        order = list(catalogue.FRAMEWORKS)
        rows = sorted(kept + fresh, key=lambda r: order.index(r["framework"]))
        table.write_csv(rows, csv_path)
        for row in rows:
            if row["status"] != table.SCORED:
                print(f"{row['framework']} {row['setting']}: {row['status']}", file=sys.stderr)
    md_path.write_text(report.render_markdown(rows))
    report.render_figure(rows, figure_path)
    print(f"wrote {md_path}, {csv_path}, {figure_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
