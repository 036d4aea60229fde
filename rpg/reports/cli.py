"""``python -m rpg.reports {tables,curves} ...``: the command line of the reports.

``scripts/report_tables.py`` and ``scripts/plot_curves.py`` are the same two commands (thin
wrappers, kept for old command lines). A RUN argument is ``PATH`` or ``LABEL=PATH``; the label (default: the file stem or directory
name) is the table row and legend name (runs sharing a given label are seeds; default labels are never
shared), and matches a published method case-insensitively; which logs
are runs (a TensorBoard log folder of runs, a log given twice): rpg.reports.runs.
"""

from __future__ import annotations

import argparse
import sys

from rpg.data.io import WriteError, write_text_atomic
from rpg.reports.benchmarks import PAPER_METRIC
from rpg.reports.figures import ENTROPY_KEY, LENGTH_KEY, REWARD_KEY, default_panels, plot_curves
from rpg.reports.logs import check_metric
from rpg.reports.published import TABLES, get_layout
from rpg.reports.runs import load_runs
from rpg.reports.tables import build_table, render_latex, render_markdown


def parse_source_map(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--source-map expects DATA_SOURCE=BENCHMARK, got {item!r}")
        ds, bench = item.rsplit("=", 1)
        out[ds] = bench
    return out


def parse_last_step(text: str) -> int | None:
    if text == "final":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--last-step must be an integer or 'final', got {text!r}") from None


def _common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("runs", nargs="+", metavar="RUN", help="[LABEL=]PATH: .jsonl (verl file logger), .csv (W&B), TensorBoard dir/file")
    ap.add_argument("--metric", default=None, help="validation metric after val-core/<data_source>/ for every benchmark "
                    "(default: the paper's per benchmark: acc/mean@32 on AIME/AMC, acc/mean@1 on Minerva/OlympiadBench; "
                    "authors' 32-copies layout: acc/mean@1)")
    ap.add_argument("--source-map", action="append", metavar="DS=BENCH", help="map a data_source to AIME24|AIME25|AMC23|Minerva|OlympiadBench|ignore")


TABLES_HELP = "print a paper table (3, 5, 6, 7, 8) from run logs, ours vs published"
CURVES_HELP = "draw the training-dynamics figure in the layout of Fig. 4 (PNG + SVG)"


def add_tables_args(ap: argparse.ArgumentParser) -> None:
    _common(ap)
    ap.add_argument("--table", required=True, choices=sorted(TABLES))
    ap.add_argument("--format", default="markdown", choices=["markdown", "latex"])
    ap.add_argument("--last-step", default="400", help="step of 'Last' (default 400) or 'final'")
    ap.add_argument("--allow-unequal-steps", action="store_true",
                    help="average seeds of a label that end at different steps (refused without it); the cells are "
                         "marked ‡ and a note names the steps")
    ap.add_argument("--out", help="write the table here instead of stdout")


def add_curves_args(ap: argparse.ArgumentParser) -> None:
    _common(ap)
    ap.add_argument("--out", default="training_curves", help="output path without suffix; writes OUT.png and OUT.svg")
    ap.add_argument("--reward-key", default=REWARD_KEY)
    ap.add_argument("--entropy-key", default=ENTROPY_KEY)
    ap.add_argument("--length-key", default=LENGTH_KEY)
    ap.add_argument("--last-step", default="final", help="x-axis end and marked Last step (default: final logged step)")


def run_tables(args: argparse.Namespace) -> int:
    try:
        runs = load_runs(args.runs)
        check_metric(runs, args.metric or {PAPER_METRIC[b] for b in get_layout(args.table).benchmarks})
        td = build_table(runs, args.table, args.metric, parse_last_step(args.last_step), parse_source_map(args.source_map),
                         allow_unequal_steps=args.allow_unequal_steps)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for w in td.warnings:
        print(f"warning: {w}", file=sys.stderr)
    text = render_markdown(td) if args.format == "markdown" else render_latex(td)
    if args.out:
        try:
            write_text_atomic(text, args.out)
        except OSError as err:  # rpg.data.io.WriteError: names the part of the path that failed
            print(f"error: cannot write --out {args.out}: {err.strerror or err}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0


def run_curves(args: argparse.Namespace) -> int:
    try:
        runs = load_runs(args.runs)
        metric = args.metric or PAPER_METRIC["AIME24"]  # the curves show AIME24 / AIME25
        check_metric(runs, metric)
        panels = default_panels(metric, args.reward_key, args.entropy_key, args.length_key)
        paths, warns = plot_curves(runs, args.out, metric, parse_source_map(args.source_map), panels,
                                   last_step=parse_last_step(args.last_step))
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the figure files (the directory: rpg.data.io.WriteError names the failing part)
        where = f" ({err.filename})" if err.filename and not isinstance(err, WriteError) else ""
        print(f"error: cannot write --out {args.out}: {err.strerror or err}{where}", file=sys.stderr)
        return 2
    for w in warns:
        print(f"warning: {w}", file=sys.stderr)
    for p in paths:
        print(p)
    return 0


COMMANDS = {"tables": (TABLES_HELP, add_tables_args, run_tables), "curves": (CURVES_HELP, add_curves_args, run_curves)}


def main(argv: list[str] | None = None) -> int:
    """``python -m rpg.reports COMMAND ...`` with COMMAND in ``COMMANDS``."""
    ap = argparse.ArgumentParser(prog="python -m rpg.reports", description="Paper tables and figures from run logs "
                                 "(docs/data-and-reports.md).")
    sub = ap.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, (text, add_args, _) in COMMANDS.items():
        add_args(sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + "."))
    args = ap.parse_args(argv)
    return COMMANDS[args.command][2](args)


def main_tables(argv: list[str] | None = None) -> int:
    """``python -m rpg.reports tables ...`` (``argv`` without the command name)."""
    return main(["tables", *(sys.argv[1:] if argv is None else argv)])


def main_plot(argv: list[str] | None = None) -> int:
    """``python -m rpg.reports curves ...`` (``argv`` without the command name)."""
    return main(["curves", *(sys.argv[1:] if argv is None else argv)])
