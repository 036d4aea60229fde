"""Tiny, locally built assets for CPU runs of the real verl trainer (no downloads).

`build_tiny_assets()` returns a `TinyAssets` record (model dir, train/val parquet files), building
them once into a cache directory keyed by a hash of this package's source.
"""

from rpg.tiny.build import TinyAssets, build_tiny_assets, default_cache_root

__all__ = ["TinyAssets", "build_tiny_assets", "default_cache_root"]
