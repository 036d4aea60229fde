"""The tiny model in Qwen3's shape, built locally from the shipped Qwen2 one (no download, no training), once, cached
beside the tiny build: vLLM 0.24 runs Qwen3 (the paper's Qwen3-4B) on its newer model runner and Qwen2 on the older
one (vllm/config/vllm.py), so the GPU smoke run of this model reaches the path the paper's Qwen3 runs take.

The same tokenizer, sizes and weights as the tiny model (``rpg.tiny.build``), in ``Qwen3ForCausalLM``: Qwen3's
RMSNorm over each head's queries and keys before the rotary embedding (``q_norm``, ``k_norm``; weights 1, as
transformers initialises them), and no attention biases (Qwen3's attention has none, as Qwen3-4B's config says:
Qwen2's query, key and value biases are left out). Both change what the attention computes, so it does not answer
the task as the tiny model does; the smoke run's checks (the ratio and KL leave 1 and 0, updates change the actor,
resets the reference) do not depend on its accuracy.

    python -m rpg.tiny.qwen3      # builds it (if needed) and prints its folder
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

from rpg.tiny.build import TinyAssets, build_tiny_assets
from rpg.tiny.build_cache import build_once

QK_NORM_KEYS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")  # the only weights Qwen2 lacks
QWEN2_BIASES = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")  # the only ones Qwen3 lacks


def qwen3_key(assets: TinyAssets) -> str:
    """This builder's source and the tiny build it starts from."""
    return hashlib.sha256(Path(__file__).read_bytes() + assets.root.name.encode()).hexdigest()[:12]


def qwen3_config(qwen2: dict) -> dict:
    """The tiny model's config (``config.json``) as Qwen3's, the same sizes."""
    return {**qwen2, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
            "head_dim": qwen2["hidden_size"] // qwen2["num_attention_heads"]}


def _build_into(out: Path, source: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = qwen3_config(json.loads((source / "config.json").read_text()))
    model_type = config.pop("model_type")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config), dtype=torch.float32)
    missing, unexpected = model.load_state_dict(load_file(source / "model.safetensors"), strict=False)
    missing = [k for k in missing if not k.endswith(QK_NORM_KEYS) and k != "lm_head.weight"]  # lm_head: tied
    unexpected = [k for k in unexpected if not k.endswith(QWEN2_BIASES)]
    if missing or unexpected:
        raise RuntimeError(f"{source}: the Qwen2 weights do not map onto Qwen3's: missing {missing}, "
                           f"unexpected {unexpected}")
    model.save_pretrained(out / "model")
    for f in source.iterdir():  # the tokenizer, chat template and generation config
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            shutil.copyfile(f, out / "model" / f.name)


def build_tiny_qwen3(assets: TinyAssets | None = None, prefix: str = "[tiny]", quiet: bool = False) -> Path:
    """The Qwen3-shaped tiny model's folder (built first when this builder has not built it from this tiny build)."""
    assets = assets or build_tiny_assets(prefix=prefix, quiet=quiet)
    root = assets.root.parent / f"{assets.root.name}-qwen3-{qwen3_key(assets)}"

    def log(message: str) -> None:
        if not quiet:
            print(f"{prefix} {message}", file=sys.stderr, flush=True)

    build_once(assets.root.parent, root, lambda: (root / "model" / "config.json").is_file(),
               lambda tmp: _build_into(tmp, assets.model_dir), log, "the tiny model in Qwen3's shape")
    return root / "model"


if __name__ == "__main__":
    print(build_tiny_qwen3())
