"""Measure a checkpoint save with its completion marker, and the resume's check of it, with the digests computed
in one process after the save (as the trainer did before) against each rank hashing the files it wrote (now:
``rpg.verl.checkpoint_digests``), at world size 1 and 2.

Per world size W and arm, W rank processes (forked; their tensors built before the clock starts) each
``torch.save`` their share of ``--gib`` GiB of fp32 tensors as verl's FSDP manager names them (a model file, an
optimizer file twice its size, a small extra-state file), and the trainer (this process) its ``data.pt``; then

* ``one process`` (before): the trainer writes the marker hashing every file (``write_marker(folder)``, the
  code path of the trainer before this change);
* ``per rank`` (now): each rank hashes its own files right after its save (``rank_entries``), the trainer joins
  the reports and hashes only its ``data.pt`` (``write_marker(folder, known=...)``).

``save+marker``: from the first rank's start to the marker written (the time the GPUs would sit idle at each save),
and the part of it after the last rank's save returned; what the trainer process reads back;
``verify``: the resume's check before Ray (``checkpoint_problem``: sizes, zips, every digest), the same code in both
arms. The median of ``--repeats``; the files are in the page cache (written just before), as on a rank's own node.
Printed: one line per world size and arm, then the ratios before/after measured in this invocation (a shared
machine's speed moves between invocations: compare within one only). On one machine both arms hash on the same
cores (the one process already hashes several files at once): what a cluster gains, each node hashing its own
ranks' files from its own page cache, with no byte through the trainer's node, cannot be measured here; the
bytes the trainer reads are printed instead.

    python benchmarks/bench_checkpoint_digests.py [--gib 1.5] [--repeats 3] [--dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from rpg.verl.checkpoint_digests import join_reports, rank_entries  # noqa: E402
from rpg.verl.checkpoints import MARKER, checkpoint_problem, write_marker  # noqa: E402
from rpg.verl.resume_world_size import shard_file  # noqa: E402

WORLD_SIZES = (1, 2)
ARMS = ("one process", "per rank")
SHARES = {"model": 1, "optim": 2}  # of a rank's bytes, as a model's weights and Adam's two states; extra_state is small
_CHUNK = 16 << 20  # bytes per tensor


def _tensors(nbytes: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n, chunk = max(1, nbytes // 4), _CHUNK // 4
    return {f"t{i}": torch.rand(min(chunk, n - i * chunk), generator=g) for i in range((n + chunk - 1) // chunk)}


def _rank(folder: Path, rank: int, world: int, nbytes: int, hash_here: bool, start, out) -> None:
    """One rank: build its tensors, wait for the start, save its files (and hash them when ``hash_here``)."""
    total = sum(SHARES.values())
    states = {kind: _tensors(nbytes * share // total, 10 * rank + i) for i, (kind, share) in enumerate(SHARES.items())}
    states["extra_state"] = {"rng": torch.get_rng_state(), "lr_scheduler": {"step": 3}}
    start.wait()
    t0 = time.monotonic()
    for kind, state in states.items():
        torch.save(state, shard_file(folder / "actor", kind, world, rank))
    saved = time.monotonic()
    report = rank_entries(folder, rank, world) if hash_here else {}
    out.put((rank, t0, saved, report))


def _one(base: Path, world: int, nbytes: int, arm: str) -> dict:
    folder = base / "global_step_1"
    (folder / "actor").mkdir(parents=True)
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(folder, r, world, nbytes // world, arm == "per rank", start, out))
             for r in range(world)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # let the ranks build their tensors; each waits for the start
    start.set()
    results = sorted(out.get() for _ in procs)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a rank process exited with {p.exitcode}")
    torch.save({"epoch": 0, "index": 1}, folder / "data.pt")  # the trainer's own file, after verl's save returned
    known = join_reports([report for _, _, _, report in results]) if arm == "per rank" else None
    write_marker(folder, 1, None, known=known)
    done = time.monotonic()
    save_s, after_s = done - min(t0 for _, t0, _, _ in results), done - max(saved for _, _, saved, _ in results)
    t = time.monotonic()
    problem = checkpoint_problem(folder)
    verify_s = time.monotonic() - t
    if problem is not None:
        raise RuntimeError(f"the saved checkpoint does not verify: {problem}")
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != MARKER]
    size = sum(p.stat().st_size for p in files)
    trainer_read = sum(p.stat().st_size for p in files if p.relative_to(folder).as_posix() not in (known or {}))
    shutil.rmtree(folder)
    return {"save_marker_s": save_s, "after_save_s": after_s, "verify_s": verify_s, "bytes": size,
            "trainer_read": trainer_read}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.5, help="checkpoint size (all ranks together)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per world size and arm (median)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    nbytes = int(args.gib * (1 << 30))
    res: dict = {}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench_ckpt_") as tmp:
        for world in WORLD_SIZES:
            runs = {arm: [] for arm in ARMS}
            for i in range(args.repeats):
                for arm in (ARMS if i % 2 == 0 else ARMS[::-1]):  # alternate the order: load drifts
                    runs[arm].append(_one(Path(tmp) / f"{world}_{i}", world, nbytes, arm))
            res[str(world)] = {arm: {**{k: statistics.median(r[k] for r in rs)
                                        for k in ("save_marker_s", "after_save_s", "verify_s")},
                                     "gib": rs[0]["bytes"] / (1 << 30), "trainer_read_mib": rs[0]["trainer_read"] / (1 << 20)}
                               for arm, rs in runs.items()}
    ratios = {}
    for world, arms in res.items():
        for arm, r in arms.items():
            print(f"world size {world}, {arm:>11}: {r['gib']:.2f} GiB, save+marker {r['save_marker_s']:.2f} s (of which "
                  f"{r['after_save_s']:.2f} s after the last rank's save), the trainer reads {r['trainer_read_mib']:.1f} "
                  f"MiB; verify at resume {r['verify_s']:.2f} s")
        before, after = arms["one process"], arms["per rank"]
        ratios[world] = {"save_marker": before["save_marker_s"] / after["save_marker_s"],
                         "trainer_read": before["trainer_read_mib"] / after["trainer_read_mib"],
                         "save_marker_verify": (before["save_marker_s"] + before["verify_s"])
                         / (after["save_marker_s"] + after["verify_s"])}
        print(f"world size {world}: save+marker one process / per rank = {ratios[world]['save_marker']:.2f}; "
              f"save+marker+verify = {ratios[world]['save_marker_verify']:.2f}; bytes the trainer reads = "
              f"{ratios[world]['trainer_read']:.0f}")
    if args.json:
        args.json.write_text(json.dumps({"results": res, "ratios": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
