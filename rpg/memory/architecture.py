"""Model shapes for the memory estimate: the sizes of a dense decoder-only transformer (``Architecture``),
read from a local model directory's ``config.json`` or taken from the public configs of the models the
paper's scripts train (``KNOWN_ARCHITECTURES``): ``architecture_for(model_path)``.

The parameter count and the KV-cache bytes per token follow from the layout (Qwen2: biases on q/k/v;
Qwen3: RMSNorm on q and k per head; Llama / Mistral: neither); any other model type is refused with
one line (``MemoryEstimateError``), as is a config.json that lacks a size.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpg.memory.sizes import MemoryEstimateError


@dataclass(frozen=True)
class Architecture:
    """A dense decoder-only transformer (Qwen2 / Qwen3 / Llama layout)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool
    qkv_bias: bool      # Qwen2: q/k/v projections have biases
    qk_norm: bool       # Qwen3: RMSNorm on q and k per head
    max_position_embeddings: int | None = None  # verl's vLLM max_model_len when rollout.max_model_len is unset

    @property
    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        n = self.hidden * q + 2 * self.hidden * kv + q * self.hidden + 3 * self.hidden * self.intermediate
        n += 2 * self.hidden                              # input / post-attention RMSNorm
        n += (q + 2 * kv) if self.qkv_bias else 0
        n += 2 * self.head_dim if self.qk_norm else 0
        return n

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self.layers * self.layer_params + embeddings + self.hidden   # + final norm

    def kv_cache_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V of every layer for one token (vLLM's cache dtype = model dtype, bf16)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def _qwen2(name: str, max_pos: int) -> Architecture:   # config.json of Qwen/Qwen2.5-7B, -Instruct and -Math-7B
    return Architecture(name, layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, head_dim=128,
                        vocab=152064, tie_embeddings=False, qkv_bias=True, qk_norm=False,
                        max_position_embeddings=max_pos)


def _qwen3_4b(name: str, max_pos: int) -> Architecture:  # config.json of Qwen/Qwen3-4B and Qwen3-4B-Base
    return Architecture(name, layers=36, hidden=2560, intermediate=9728, heads=32, kv_heads=8, head_dim=128,
                        vocab=151936, tie_embeddings=True, qkv_bias=False, qk_norm=True,
                        max_position_embeddings=max_pos)


KNOWN_ARCHITECTURES: dict[str, Architecture] = {  # max_position_embeddings from each public config.json
    "Qwen/Qwen2.5-Math-7B": _qwen2("Qwen/Qwen2.5-Math-7B", 4096),
    "Qwen/Qwen2.5-7B-Instruct": _qwen2("Qwen/Qwen2.5-7B-Instruct", 32768),
    "Qwen/Qwen2.5-7B": _qwen2("Qwen/Qwen2.5-7B", 131072),
    "Qwen/Qwen3-4B": _qwen3_4b("Qwen/Qwen3-4B", 40960),
    "Qwen/Qwen3-4B-Base": _qwen3_4b("Qwen/Qwen3-4B-Base", 32768),
}

_LAYOUTS = {"qwen2": (True, False), "qwen3": (False, True), "llama": (False, False), "mistral": (False, False)}


def architecture_from_hf_config(config: Mapping[str, Any], name: str) -> Architecture:
    """Architecture from a Hugging Face ``config.json`` (model_type qwen2, qwen3, llama, mistral)."""
    model_type = config.get("model_type")
    if model_type not in _LAYOUTS:
        raise MemoryEstimateError(f"{name}: model_type={model_type!r} is not modelled; "
                                  f"supported: {', '.join(_LAYOUTS)} (dense decoders)")
    try:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        bias, qk_norm = _LAYOUTS[model_type]
        return Architecture(
            name, layers=int(config["num_hidden_layers"]), hidden=hidden,
            intermediate=int(config["intermediate_size"]), heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads), vocab=int(config["vocab_size"]),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bias or bool(config.get("attention_bias", False)), qk_norm=qk_norm,
            max_position_embeddings=int(config["max_position_embeddings"]) if config.get("max_position_embeddings") else None)
    except (KeyError, TypeError, ValueError) as e:
        raise MemoryEstimateError(f"{name}: config.json lacks or mangles a size field ({e})") from None


def architecture_for(model_path: str) -> Architecture:
    """A local model directory's ``config.json``, else a known Hugging Face id; anything else fails."""
    local = Path(model_path).expanduser()
    if (local / "config.json").is_file():
        path = local / "config.json"
        try:
            config = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise MemoryEstimateError(f"{path}: not a readable JSON file ({e})") from None
        if not isinstance(config, dict):
            raise MemoryEstimateError(f"{path}: expected a JSON object, got {type(config).__name__}")
        return architecture_from_hf_config(config, str(local))
    for known, arch in KNOWN_ARCHITECTURES.items():
        if known.lower() == model_path.strip().rstrip("/").lower():
            return arch
    raise MemoryEstimateError(
        f"no architecture for model {model_path!r}: not a local directory with config.json and not one of "
        f"{', '.join(KNOWN_ARCHITECTURES)} (set MODEL_PATH to a downloaded copy)")
