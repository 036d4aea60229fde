"""Make the tiny model's weights anew and ship them: ``python -m rpg.tiny.regenerate --reason TEXT``.

The tokenizer and the warm-up (``rpg.tiny.warm_up``) run on this machine, into a temporary folder; when the new
weights differ from the shipped ones, the new files replace ``rpg/tiny/weights/``, ``rpg/tiny/weights.json``
records each file's sha256 and how they were made (``rpg.run_record.ran_on``), and a row with the reason is appended
to the reference log (docs/reference-log.md). Every run trained on the tiny model moves with them: commit them with
the regenerated references (``python -m rpg_lab.demo.reference --regenerate``). Exit 0 (also when nothing changed), 2 on
a missing reason.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rpg.run_record import code_state, file_sha256, log_change, ran_on, short
from rpg.tiny.build import MANIFEST, WEIGHTS_DIR, read_manifest


def regenerate(reason: str, log=print) -> bool:
    """Make the weights; replace the shipped ones when they differ. Whether they changed."""
    from rpg.tiny.warm_up import make_model

    before = read_manifest()["files"].get("model.safetensors") if MANIFEST.exists() else None
    with tempfile.TemporaryDirectory(prefix="rpg-tiny-weights-") as tmp:
        made = make_model(Path(tmp), log)
        files = {p.name: file_sha256(p) for p in sorted(Path(tmp).iterdir()) if p.is_file()}
        after = files["model.safetensors"]
        if after == before:
            log(f"the weights made here are the shipped ones (sha256 {short(after)}): nothing changed")
            return False
        record = ran_on(tmp)
        shipped = set(read_manifest()["files"]) if MANIFEST.exists() else set()
        others = sorted(p.name for p in WEIGHTS_DIR.glob("*") if p.name not in shipped) if WEIGHTS_DIR.exists() else []
        if others:  # only the files the manifest names are replaced: anything else there is someone's
            raise SystemExit(f"[tiny] {WEIGHTS_DIR}: {', '.join(others)} not named in {MANIFEST.name}; move them "
                             f"away first (nothing was changed)")
        WEIGHTS_DIR.mkdir(exist_ok=True)
        for name in shipped:
            (WEIGHTS_DIR / name).unlink(missing_ok=True)
        for name in files:
            shutil.copyfile(Path(tmp) / name, WEIGHTS_DIR / name)
    code = code_state()
    manifest = {"files": files, "made": {"date": time.strftime("%Y-%m-%d", time.gmtime()), **made,
                                         "code": code["code"], "commit": code["commit"],
                                         **{k: record[k] for k in ("libraries", "kernels")}}}
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    path = log_change("tiny model weights", before, after, reason, record)
    log(f"new weights: sha256 {short(before)} -> {short(after)}; {WEIGHTS_DIR}, {MANIFEST.name} and {path} written")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reason", required=True, help="why the weights are made anew (the reference log's row)")
    args = ap.parse_args(argv)
    if not args.reason.strip():
        ap.error("--reason: say why the weights are made anew (an empty reason is refused)")
    regenerate(args.reason, lambda line: print(f"[tiny] {line}", flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
