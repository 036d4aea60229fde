"""Build the tiny model, tokenizer and task files locally (no downloads), once, cached.

The model and its tokenizer are shipped with the package (``rpg/tiny/weights/``; each file's sha256 in
``rpg/tiny/weights.json``): a build copies them and checks every byte against the manifest, so the tiny model has
the same bits on every machine, CPU kernel path and library version (``rpg.tiny.warm_up``: how they were made, and
why they are not made anew on each machine; ``python -m rpg.tiny.regenerate --reason TEXT`` makes and records new
ones). The task files are made from ``rpg.tiny.task``'s seeded splits.

Layout of a build (``<cache_root>/<key>/``; ``key`` = hash of this file, ``task.py`` and the weights' manifest, so
new weights or another task yield a fresh build and reruns reuse the old one):

    model/        Qwen2ForCausalLM (float32 safetensors) + byte-level BPE tokenizer + chat template (copied)
    train.parquet RL prompts (verl RLHFDataset rows, data_source=math_dapo)
    val.parquet   held-out RL prompts (disjoint (a, b) pairs)
    sft.parquet   the supervised warm-up split the weights were made with (noisy labels; see rpg.tiny.task)
    build.json    what was built: the weights' sha256 and how they were made
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from rpg.paths.checkout import checkout_root
from rpg.run_record import file_sha256, short
from rpg.tiny import task
from rpg.tiny.build_cache import build_once

CACHE_ENV = "RPG_TINY_CACHE"
WEIGHTS_DIR = Path(__file__).parent / "weights"  # the shipped model folder
MANIFEST = Path(__file__).parent / "weights.json"  # its files' sha256 and how they were made
SEED = 1234
N_VAL = 30


class TinyBuildError(RuntimeError):
    """A shipped file that is not the one its manifest names: one line naming it and both digests."""


@dataclass(frozen=True)
class TinyAssets:
    root: Path
    model_dir: Path
    train_file: Path
    val_file: Path
    sft_file: Path

    @classmethod
    def at(cls, root: Path) -> "TinyAssets":
        root = Path(root)
        return cls(root, root / "model", root / "train.parquet", root / "val.parquet", root / "sft.parquet")

    def complete(self) -> bool:
        return all(p.exists() for p in (self.model_dir / "config.json", self.train_file, self.val_file, self.root / "build.json"))


def default_cache_root() -> Path:
    """``$RPG_TINY_CACHE``, else ``<project root>/.cache/rpg-tiny``, else ``~/.cache/rpg-tiny``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    root = checkout_root()
    return (root / ".cache" / "rpg-tiny") if root else Path.home() / ".cache" / "rpg-tiny"


BUILDER_SOURCES = ("build.py", "task.py", "weights.json")  # what determines the assets (not overrides.py etc.)


def builder_key(folder: Path = Path(__file__).parent) -> str:
    """Content hash of the builder's sources and the weights' manifest in ``folder`` -> cache sub-directory name."""
    h = hashlib.sha256()
    for f in sorted(folder / name for name in BUILDER_SOURCES):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def read_manifest() -> dict:
    """``weights.json``: ``files`` ({file name: sha256}) and ``made`` (how and where the weights were made)."""
    return json.loads(MANIFEST.read_text())


def weights_sha256() -> str:
    """The shipped weights' sha256 (``rpg.run_record.weights_digest`` of a build's model folder)."""
    return read_manifest()["files"]["model.safetensors"]


def build_tiny_assets(cache_root: Path | str | None = None, force: bool = False, quiet: bool = False,
                      prefix: str = "[tiny]") -> TinyAssets:
    """Return the tiny assets, building them first if this builder version has not built them yet.

    A build prints progress lines on stderr (unless ``quiet``), each starting with the caller's ``prefix``
    (the GPU smoke run's own). Concurrent calls are safe, and a build is published only when complete
    (``rpg.tiny.build_cache.build_once``). The build's weights are checked against the manifest at every call (1.4 MB
    hashed): a cached model changed since it was built is ``TinyBuildError``, never a silent other model.
    """
    cache_root = Path(cache_root) if cache_root is not None else default_cache_root()
    assets = TinyAssets.at(cache_root / builder_key())

    def log(message: str) -> None:
        if not quiet:
            print(f"{prefix} {message}", file=sys.stderr, flush=True)

    build_once(cache_root, assets.root, assets.complete, lambda tmp: _build_into(tmp, log), log,
               "the tiny model and task", force=force)
    found, shipped = file_sha256(assets.model_dir / "model.safetensors"), weights_sha256()
    if found != shipped:
        raise TinyBuildError(f"{assets.model_dir / 'model.safetensors'}: sha256 {short(found)}, the shipped weights' "
                             f"{short(shipped)}: the cached build was changed after it was built; build it again "
                             f"(rpg.tiny.build_tiny_assets(force=True)) or remove {assets.root}")
    return assets


# ----------------------------------------------------------------------------------------------


def copy_weights(model_dir: Path, manifest: dict) -> None:
    """The shipped model folder into ``model_dir``, every file checked against ``manifest`` (``TinyBuildError``)."""
    shipped = sorted(p.name for p in WEIGHTS_DIR.iterdir() if p.is_file())
    if shipped != sorted(manifest["files"]):
        raise TinyBuildError(f"{WEIGHTS_DIR}: holds {', '.join(shipped) or 'nothing'}, {MANIFEST.name} names "
                             f"{', '.join(sorted(manifest['files']))}; a damaged checkout or package (reinstall it)")
    model_dir.mkdir(parents=True)
    for name, digest in sorted(manifest["files"].items()):
        shutil.copyfile(WEIGHTS_DIR / name, model_dir / name)
        found = file_sha256(model_dir / name)
        if found != digest:
            raise TinyBuildError(f"{WEIGHTS_DIR / name}: sha256 {short(found)}, {MANIFEST.name} says {short(digest)}: "
                                 f"not the shipped file; python -m rpg.tiny.regenerate --reason TEXT makes and records "
                                 f"new weights")


def parameter_count(weights: Path) -> int:
    """The number of parameters a safetensors file holds, from its header (no tensor is read)."""
    with open(weights, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    count = 0
    for name, entry in header.items():
        if name != "__metadata__":
            n = 1
            for d in entry["shape"]:
                n *= d
            count += n
    return count


def _build_into(out: Path, log=lambda message: None) -> None:
    import pandas as pd

    from rpg.tiny.warm_up import warm_up_split

    manifest = read_manifest()
    copy_weights(out / "model", manifest)
    log(f"model copied: weights sha256 {short(manifest['files']['model.safetensors'])} (shipped, checked)")
    train_pairs, val_pairs = task.split_pairs(SEED, N_VAL)
    sft = warm_up_split(SEED)
    rows = lambda pairs, split: [task.rl_row(a, b, split, i) for i, (a, b) in enumerate(pairs)]  # noqa: E731
    pd.DataFrame(rows(train_pairs, "train")).to_parquet(out / "train.parquet")
    pd.DataFrame(rows(val_pairs, "val")).to_parquet(out / "val.parquet")
    pd.DataFrame(
        [{"prompt": task.question(a, b), "response": y, "correct": y == task.response(a + b)} for a, b, y in sft]
    ).to_parquet(out / "sft.parquet")
    config = json.loads((out / "model" / "config.json").read_text())
    info = {
        "builder_key": builder_key(),
        "weights_sha256": manifest["files"]["model.safetensors"],
        "n_params": parameter_count(out / "model" / "model.safetensors"),
        "vocab_size": config["vocab_size"],
        "n_train_prompts": len(train_pairs),
        "n_val_prompts": len(val_pairs),
        "n_sft_examples": len(sft),
        "sft_target_accuracy": sum(y == task.response(a + b) for a, b, y in sft) / len(sft),
        "made": manifest["made"],
    }
    (out / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"built: {info['n_params'] / 1e6:.2f} M parameters")
