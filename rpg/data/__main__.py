"""CLI: ``python -m rpg.data {list,prepare,prepare-all} ...``. Thin: all logic is in rpg.data.prepare."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rpg.data.io import LOCAL_SUFFIXES
from rpg.data.prepare import NoValidRows, Summary, prepare, reason_class
from rpg.data.rows import EVAL_OVERLAP
from rpg.data.hub_datasets import SOURCES

EVAL_DEFAULT = ["aime2024", "aime2025", "amc2023", "minerva", "olympiadbench"]
TRAIN_DEFAULT = "dapo-math-17k-en"


def _list_rejects(summary: Summary, show: int) -> None:
    """Up to ``show`` rejected rows, plain duplicates left out (counted in the summary line; every
    rejected row is in the rejects file)."""
    listed = [r for r in summary.rejects if reason_class(r.reason) != "duplicate"]
    for r in listed[:show]:
        print(f"  {summary.source}: rejected {r.where}: {r.reason}", file=sys.stderr)
    if len(listed) > show:
        print(f"  ... {len(listed) - show} more", file=sys.stderr)


def _report(summary: Summary, show: int) -> None:
    """The rejected rows (``_list_rejects``), then the summary line (and the relabelling's, if any)."""
    _list_rejects(summary, show)
    print(summary.line())
    if (relabelled := summary.relabel_line()) is not None:
        print(f"warning: {relabelled}", file=sys.stderr)


def _report_overlap(train: Summary, evals: list[Summary], dropped: bool) -> None:
    """One line per evaluation set that shares problems with the training set ``train``: the files and the count
    (dropped from the training set, or kept with a warning)."""
    same = "the same after Unicode NFKC normalisation, case and whitespace"
    for e in evals:
        if dropped:
            n = sum(r.reason == f"{EVAL_OVERLAP} ({e.out})" for r in train.rejects)
            if n:
                print(f"{train.dataset}: dropped {n} problem{'s' * (n > 1)} of {e.out} from {train.out} ({same})")
        elif n := len(train.keys & e.keys):
            print(f"warning: {train.out} shares {n} problem{'s' * (n > 1)} with the evaluation set {e.out} ({same}): "
                  "a model trained on them is evaluated on problems it has seen; --drop-eval-overlap drops them from "
                  "the training set", file=sys.stderr)


def _find_local(input_dir: Path, key: str) -> Path:
    """``<name><suffix>`` in ``input_dir`` for the preset's names (its key, then the authors' file names)."""
    if not input_dir.is_dir():
        raise ValueError(f"--input-dir {input_dir}: not a directory")
    names = [f"{stem}{suffix}" for stem in SOURCES[key].local_stems for suffix in LOCAL_SUFFIXES]
    found = [input_dir / n for n in names if (input_dir / n).is_file()]
    if len(found) > 1:
        raise ValueError(f"--input-dir {input_dir}: several files for {key}: {', '.join(p.name for p in found)}; "
                         "keep one, or use `prepare --input FILE`")
    if not found:
        raise ValueError(f"--input-dir {input_dir}: no file for {key}; looked for {', '.join(names)}")
    return found[0]


def _path(text: str) -> str:
    """A path option's value; an empty one (``--out ''``, an unset variable) would mean the current directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give a file or directory (an unset shell variable?)")
    return text


def dataset_keys(raw: str) -> list[str]:
    """``--datasets``: comma-separated presets, each known and named once; ValueError (one line) otherwise."""
    keys = [k.strip() for k in raw.split(",") if k.strip()]
    if not keys:
        raise ValueError(f"--datasets {raw!r} names no dataset; allowed: {', '.join(SOURCES)}")
    unknown = [k for k in keys if k not in SOURCES]
    if unknown:
        raise ValueError(f"unknown datasets {unknown}; allowed: {', '.join(SOURCES)}")
    twice = [k for k in dict.fromkeys(keys) if keys.count(k) > 1]
    if twice:
        raise ValueError(f"--datasets names {', '.join(twice)} twice; name each dataset once")
    return keys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rpg.data", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list the dataset presets")

    p = sub.add_parser("prepare", help="build one parquet file")
    p.add_argument("dataset", choices=sorted(SOURCES))
    p.add_argument("--out", required=True, type=_path, help="output .parquet path (a directory: DIR/<dataset>.parquet)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--input", type=_path, help="local .parquet/.json/.jsonl file (default: the preset's hub dataset)")
    src.add_argument("--hf", help="Hugging Face dataset name overriding the preset's")
    p.add_argument("--hf-config", help="Hugging Face dataset config")
    p.add_argument("--split", help="Hugging Face split (default: the preset's, or the only one)")
    p.add_argument("--problem-key", help="column holding the problem text (required when several candidates exist)")
    p.add_argument("--answer-key", help="column holding the ground-truth answer (required when several candidates exist)")
    p.add_argument("--data-source", help="data_source value to write (default: the preset's); one a reward function "
                   "scores (rpg.reward, verl's default_compute_score)")
    p.add_argument("--any-data-source", action="store_true",
                   help="write a --data-source no built-in reward function scores (your own reward.custom_reward_function does)")
    p.add_argument("--relabel", action="store_true",
                   help="write input rows labelled with another benchmark's data_source as this preset's (refused "
                        "without it: the reports would file their results under this benchmark)")
    p.add_argument("--copies", type=int, help="rows per problem; 1 (default) for val_kwargs.n=32, 32 = authors' layout")
    p.add_argument("--show-rejects", type=int, default=20,
                   help="rejected rows to print, plain duplicates counted only (all go to *.rejects.jsonl)")

    a = sub.add_parser("prepare-all", help="build the training file and all evaluation files")
    a.add_argument("--out-dir", required=True, type=_path)
    a.add_argument("--input-dir", type=_path, help="read <dataset>.parquet|.json|.jsonl (or the authors' names: aime-2024, "
                   "aime25, amc-23, dapo-math-17k-eng) from here instead of the hub")
    a.add_argument("--datasets", default=",".join([TRAIN_DEFAULT, *EVAL_DEFAULT]), help="comma-separated presets")
    a.add_argument("--eval-copies", type=int, default=1, help="rows per eval problem (32 = authors' layout)")
    a.add_argument("--problem-key", help="column holding the problem text, for every dataset prepared")
    a.add_argument("--answer-key", help="column holding the ground-truth answer, for every dataset prepared")
    a.add_argument("--show-rejects", type=int, default=5)
    a.add_argument("--drop-eval-overlap", action="store_true",
                   help="drop from the training set the problems an evaluation set holds (the same after Unicode NFKC "
                        "normalisation, case and whitespace); without it they are kept, and a warning counts them")

    args = ap.parse_args(argv)
    try:
        if args.cmd == "list":
            for key, s in SOURCES.items():
                print(f"{key:18s} data_source={s.data_source:14s} split={s.split:5s} hf={s.hf_name}  {s.description}")
        elif args.cmd == "prepare":
            summary = prepare(
                args.dataset, args.out, input_path=args.input, hf_name=args.hf, hf_config=args.hf_config,
                hf_split=args.split, copies=args.copies, data_source=args.data_source,
                problem_key=args.problem_key, answer_key=args.answer_key, any_data_source=args.any_data_source,
                relabel=args.relabel,
            )
            _report(summary, args.show_rejects)
        else:
            keys = dataset_keys(args.datasets)
            out_dir = Path(args.out_dir)
            evals: list[Summary] = []  # the evaluation sets first: a training set is checked against them
            for key in sorted(keys, key=lambda k: SOURCES[k].split != "test"):
                inp = _find_local(Path(args.input_dir), key) if args.input_dir else None
                test = SOURCES[key].split == "test"
                exclude = {k: e.out for e in reversed(evals) for k in e.keys} if args.drop_eval_overlap else None
                summary = prepare(key, out_dir / f"{key}.parquet", input_path=inp, copies=args.eval_copies if test else 1,
                                  problem_key=args.problem_key, answer_key=args.answer_key,
                                  exclude=None if test else exclude)
                _report(summary, args.show_rejects)
                if test:
                    evals.append(summary)
                else:
                    _report_overlap(summary, evals, args.drop_eval_overlap)
    except (ValueError, OSError) as err:  # OSError: an unwritable --out (the message names the path)
        if isinstance(err, NoValidRows):
            _list_rejects(err.summary, args.show_rejects)
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
